return { steps = 5, shared = include "../shared.lua" }
