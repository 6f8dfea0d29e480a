return {
    extends = "base/nope.lua",
    lr = 1,
}
