// Package clusterset owns the connections to every member of a ClusterSet
// and a watch-based, trimmed cache of what the import computation reads
// from each: InferencePools, Services, EndpointSlices, Gateways and
// Namespaces. Members come and go at run time (kubeconfig files and
// labelled Secrets); a member that cannot be reached keeps its last known
// data and is flagged. Consumers read the cache through Snapshot and learn
// about changes through an event handler; the package never computes
// imports itself.
package clusterset
