-- The cnn and resnet builders, whose options the tests set from the command line.
return {
    model = cnn { input = { 8, 8, 1 }, channels = { 4, 8 }, classes = 10 },
}
