-- extends may not leave the directories a recipe may read: this one's
-- directory (run from the command line), TRAINRUN_RECIPE_PATH, the installed
-- recipes. ../base.lua is none of them.
return {
    extends = "../base.lua",
}
