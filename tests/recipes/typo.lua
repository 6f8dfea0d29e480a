return {
    extends = "base.lua",
    schedule = {
        wramup = 50,
    },
}
