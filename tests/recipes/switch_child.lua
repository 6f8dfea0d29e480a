-- Extends switch_base.lua and switches the schedule and checkpoint plugins.
return {
    extends = "switch_base.lua",
    schedule = { plugin = "step", step_size = 3 },
    checkpoint = { plugin = "s3", bucket = "b" },
    data = { plugin = "text", val_fraction = 0.2 },
    optim = { name = "adamw" },
}
