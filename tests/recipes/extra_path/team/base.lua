return { team = "vision", seed = 3 }
