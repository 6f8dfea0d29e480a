return {
    model = strict { width = 3 },
}
