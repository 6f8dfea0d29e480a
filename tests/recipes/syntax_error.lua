return {
    lr = 3e-4
    steps = 10,
}
