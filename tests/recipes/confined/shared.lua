return { name = "shared" }
