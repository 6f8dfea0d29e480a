return {
    extends = "base.lua",
    seed = append { 2 },
}
