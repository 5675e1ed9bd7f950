// Package podstart tests that the pods the Helm chart charts/mci renders
// really start: for the default values and a values file per mode
// (testdata), it renders the chart with helm, installs what it renders in
// a cluster of a local ClusterSet (real kube-apiservers), and starts every
// container as a kubelet would. `make test-pods-start` runs it after
// `make images`.
//
// What it does as the kubelet and its runtime do: the entrypoint is the
// one of the image `make images` built, run from the image's own file
// system: the test binary starts again as the container's init
// (runtime_test.go), in a mount namespace of its own, mounts /proc and a
// /dev of the standard devices there, makes the root read-only when
// readOnlyRootFilesystem says so (emptyDirs stay writable), chroots into
// it, sets no_new_privs when allowPrivilegeEscalation is false, drops to
// the rendered runAsUser/runAsGroup (else the image's user) and executes
// the entrypoint with the rendered command, args and env ($(VAR)
// references expanded; fieldRef, secretKeyRef and configMapKeyRef
// resolved). The pod's volumes (ConfigMaps, Secrets, projected
// ServiceAccount tokens, downwardAPI, emptyDir, hostPath) are files at
// their mountPaths, read from the cluster the chart is installed in, as a
// kubelet reads them; a ServiceAccount token from the TokenRequest API of
// the pod's ServiceAccount, with ca.crt and namespace, is mounted at
// /var/run/secrets/kubernetes.io/serviceaccount unless automounting is
// off; KUBERNETES_SERVICE_HOST and _PORT point at the cluster's
// kube-apiserver. Init containers run in order, native sidecars
// (restartPolicy Always) until their startup probe passes, then the
// containers; every startup, readiness and liveness probe runs as
// rendered (httpGet, tcpSocket, grpc; named ports; the probe's own
// timing) against the pod's address, and the test fails with the
// container's log when one does not pass in time. Then the data path: the
// aggregator of the chart's cluster serves InferencePoolImports through
// the chart's APIService from the started mci-apiservers, and in the modes
// with a member, the import of the pool that member exports; in one mode a
// completion request sent through each gateway pod is routed by the
// chart's mci-sidecar to the EPP of the member (the local ClusterSet's
// model servers and mci-epp, test/localclusterset's StartExporters) and
// answered by one of its model servers.
//
// What it cannot do, and does instead:
//   - No network namespace: each pod gets a loopback address of its own
//     (127.0.x.y) as its pod IP, and each mci binary is given
//     --bind-address=<pod IP>, the one flag the test adds. Services have no
//     cluster IPs that route: the Service an APIService names is
//     installed as an ExternalName Service of a loopback address on which
//     the test plays kube-proxy (the Service's port to its pods'
//     targetPort).
//   - Volumes are files written into each container's root before it
//     starts, not live mounts: a volume shared by two containers is two
//     copies, and nothing is updated while the pod runs (no Secret or
//     token rotation).
//   - No cgroups (resources are not enforced), no seccomp profile or
//     capability bounding set beyond what a non-root user has, no PID, UTS
//     or IPC namespace (the hostname is the machine's), and no service
//     links besides KUBERNETES_SERVICE_HOST/_PORT.
//   - Images not built by `make images` (Envoy's) cannot be pulled here:
//     the test names each such container and does not start it, so the
//     gateway pod runs mci-sidecar alone; where a request is routed,
//     test/cmd/gateway, which speaks ext_proc as Envoy does, stands for
//     Envoy on the pod's address and port 8080, calling mci-sidecar there.
//
// It must run as root, to mount, chroot and change the user, and fails
// otherwise.
package podstart
