return { weights = { [true] = 1 } }
