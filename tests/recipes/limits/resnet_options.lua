-- The resnet builder small (tests/test_recipe.c): 32x32 images, the small
-- stem, stem width 8; options set from the command line.
return {
    model = resnet { depth = 18, width = 8, classes = 10, input = { 32, 32, 3 }, stem = "small" },
}
