local helpers = {}
return { lr = helpers.schedule(3) }
