return { name = "sgd", lr = 0.1 }
