local helpers = require "trainrun.helpers"
return { seed = helpers.now() }
