// What the web page takes from the published pi protocol v8 client and its
// chord service layer; `build.sh` bundles it into one ES module.
export { Client, ClientDisposedError, DisconnectedError, ServerError, createClientServiceTransport } from "@earendil-works/pi-client";
export { createRemoteServiceBinding, defineService } from "@earendil-works/chord";
export { BACKGROUND_CONTEXT } from "@earendil-works/chord/context";
