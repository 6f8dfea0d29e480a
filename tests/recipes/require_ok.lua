local helpers = require "trainrun.helpers"
return { steps = helpers.double(21) }
