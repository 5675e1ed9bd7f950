package extproc

// RelayedHeader marks a request an mci-sidecar relays to another
// cluster's EPP; its value is the relaying sidecar's cluster. A shim-mode
// sidecar serves such a request with its local EPP only, so that two
// clusters that both export a shim pool never send a request back and
// forth; mci-epp counts its requests in flight by it, so that each
// importing cluster can tell its own load on the pool from the rest.
const RelayedHeader = "x-mci-relayed-from"
