package podstart

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// containerInitEnv carries, to the test binary started again as a
// container's init, what it must set up (a containerSpec in JSON).
const containerInitEnv = "PODSTART_CONTAINER_INIT"

// containerSpec is what the container's init sets up before it executes
// the entrypoint, as a container runtime (runc) does.
type containerSpec struct {
	// Root is the container's root file system: the image, unpacked, with
	// the volumes' files written in.
	Root string
	// Writable are the directories under Root that stay writable when the
	// root is read-only (emptyDirs), relative to Root.
	Writable []string
	// ReadOnlyRoot is securityContext.readOnlyRootFilesystem.
	ReadOnlyRoot bool
	// NoNewPrivs is securityContext.allowPrivilegeEscalation false.
	NoNewPrivs bool
	Path       string
	Argv, Env  []string
	Dir        string
	UID, GID   int
	Groups     []int
}

func TestMain(m *testing.M) {
	if spec := os.Getenv(containerInitEnv); spec != "" {
		containerInit(spec)
	}
	os.Exit(m.Run())
}

// containerInit runs in a mount namespace of its own (the caller started
// it with CLONE_NEWNS, which Go makes private), as root: it mounts what a
// runtime mounts in a container (proc, a /dev with the standard devices),
// makes the root read-only if asked, chroots into it, drops to the
// container's user and executes the entrypoint. Nothing it mounts is seen
// outside, and it all goes away with the process.
func containerInit(encoded string) {
	var s containerSpec
	if err := json.Unmarshal([]byte(encoded), &s); err != nil {
		fail("reading the container spec: %v", err)
	}
	must := func(what string, err error) {
		if err != nil {
			fail("%s: %v", what, err)
		}
	}
	must("binding the root", unix.Mount(s.Root, s.Root, "", unix.MS_BIND|unix.MS_REC, ""))
	for _, w := range s.Writable {
		dir := filepath.Join(s.Root, w)
		must("binding "+w, unix.Mount(dir, dir, "", unix.MS_BIND, ""))
	}
	proc := filepath.Join(s.Root, "proc")
	must("creating /proc", os.MkdirAll(proc, 0o555))
	must("mounting /proc", unix.Mount("proc", proc, "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""))
	dev := filepath.Join(s.Root, "dev")
	must("creating /dev", os.MkdirAll(dev, 0o755))
	must("mounting /dev", unix.Mount("tmpfs", dev, "tmpfs", unix.MS_NOSUID|unix.MS_STRICTATIME, "mode=755,size=65536k"))
	for _, d := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		target := filepath.Join(dev, d)
		must("creating /dev/"+d, os.WriteFile(target, nil, 0o666))
		must("binding /dev/"+d, unix.Mount("/dev/"+d, target, "", unix.MS_BIND, ""))
	}
	if s.ReadOnlyRoot {
		must("making the root read-only", unix.Mount(s.Root, s.Root, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""))
	}
	must("chroot", unix.Chroot(s.Root))
	must("chdir "+s.Dir, unix.Chdir(s.Dir))
	must("setgroups", unix.Setgroups(s.Groups))
	must("setgid", unix.Setgid(s.GID))
	must("setuid", unix.Setuid(s.UID))
	if s.NoNewPrivs {
		must("no_new_privs", unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
	}
	must("exec "+s.Path, unix.Exec(s.Path, s.Argv, s.Env))
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "container init: "+format+"\n", args...)
	os.Exit(127)
}
