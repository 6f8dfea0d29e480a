-- Recipes cannot reach the operating system.
return {
    seed = os.time(),
}
