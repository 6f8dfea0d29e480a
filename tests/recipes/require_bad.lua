local socket = require "socket"
return { socket = socket }
