return {
    extends = "cycle_a.lua",
}
