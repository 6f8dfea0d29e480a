return {
    extends = "cycle_b.lua",
}
