// Preloaded with `node -r`: a listen() given only a port binds 127.0.0.1, so a test server stays on loopback
// (server-everything's HTTP mode listens on every interface otherwise).
const net = require("node:net");
const listen = net.Server.prototype.listen;
net.Server.prototype.listen = function (...args) {
  const port = args[0];
  if ((typeof port === "number" || (typeof port === "string" && /^\d+$/.test(port))) && typeof args[1] !== "string") {
    args.splice(1, 0, "127.0.0.1");
  }
  return listen.apply(this, args);
};
