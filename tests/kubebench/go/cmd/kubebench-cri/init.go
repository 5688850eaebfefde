package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// initSpec is what the runtime hands a container's first process (a JSON file): it runs in a
// new mount and UTS namespace (clone flags), joins the pod's network namespace, builds the
// root and execs the container's command.
type initSpec struct {
	NetNS    string      `json:"netns"` // "" for a pod on the node's network
	Hostname string      `json:"hostname"`
	Root     string      `json:"root"`
	ReadOnly []string    `json:"readOnly"`
	Writable []string    `json:"writable"`
	Mounts   []initMount `json:"mounts"`
	Argv     []string    `json:"argv"`
	Env      []string    `json:"env"`
	Dir      string      `json:"dir"`
}

type initMount struct {
	Host      string `json:"host"`
	Container string `json:"container"`
	ReadOnly  bool   `json:"readOnly"`
}

func containerInit(specFile string) {
	runtime.LockOSThread()
	spec := initSpec{}
	data, err := os.ReadFile(specFile)
	if err == nil {
		err = json.Unmarshal(data, &spec)
	}
	if err == nil {
		err = enterContainer(&spec)
	}
	if err == nil {
		var path string
		path, err = lookPath(spec.Argv[0], spec.Env)
		if err == nil {
			err = syscall.Exec(path, spec.Argv, spec.Env)
		}
	}
	fmt.Fprintf(os.Stderr, "kubebench-cri: cannot start the container: %v\n", err)
	os.Exit(128)
}

func enterContainer(spec *initSpec) error {
	if len(spec.Argv) == 0 {
		return fmt.Errorf("no command: the image has no entrypoint and the container none")
	}
	// Nothing mounted here reaches the node's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		return fmt.Errorf("make / private: %w", err)
	}
	if spec.NetNS != "" {
		fd, err := unix.Open(spec.NetNS, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open %s: %w", spec.NetNS, err)
		}
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("join %s: %w", spec.NetNS, err)
		}
		_ = unix.Close(fd)
	}
	if spec.Hostname != "" {
		if err := unix.Sethostname([]byte(spec.Hostname)); err != nil {
			return fmt.Errorf("sethostname: %w", err)
		}
	}
	root := spec.Root
	if err := ownTmpfs(root, "kubebench-root", "mode=0755", 0); err != nil {
		return err
	}
	for _, p := range spec.ReadOnly {
		if err := bindInto(root, p, p, true, false); err != nil {
			return err
		}
	}
	for _, p := range spec.Writable {
		if err := bindInto(root, p, p, false, false); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "proc"), 0o755); err != nil {
		return err
	}
	if err := unix.Mount("proc", filepath.Join(root, "proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("mount proc: %w", err)
	}
	if err := bindInto(root, "/sys", "/sys", true, true); err != nil {
		return err
	}
	if err := makeDev(root); err != nil {
		return err
	}
	// Directories of the root's own (not symlinks: a mount target is resolved before chroot,
	// and an absolute link would lead onto the node's tree).
	for _, dir := range []string{"run", "var/run", "var/tmp", "opt"} {
		if err := os.MkdirAll(filepath.Join(root, dir), 0o1777); err != nil {
			return err
		}
	}
	for _, m := range spec.Mounts {
		if err := bindInto(root, m.Host, m.Container, m.ReadOnly, true); err != nil {
			return err
		}
	}
	if err := unix.Chroot(root); err != nil {
		return fmt.Errorf("chroot %s: %w", root, err)
	}
	dir := spec.Dir
	if dir == "" {
		dir = "/"
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("working dir %s: %w", dir, err)
	}
	return unix.Chdir(dir)
}

// ownFilesystems: the devices of the tmpfs mounts this process made for the container.
var ownFilesystems = map[uint64]bool{}

func ownTmpfs(target, name, data string, flags uintptr) error {
	if err := unix.Mount(name, target, "tmpfs", flags, data); err != nil {
		return fmt.Errorf("tmpfs %s: %w", target, err)
	}
	var st unix.Stat_t
	if err := unix.Stat(target, &st); err != nil {
		return err
	}
	ownFilesystems[st.Dev] = true
	return nil
}

// makeDev gives the container a /dev of its own (a tmpfs, so the kubelet's
// /dev/termination-log can be made in it) with the node's basic character devices bound in.
func makeDev(root string) error {
	dev := filepath.Join(root, "dev")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		return err
	}
	if err := ownTmpfs(dev, "kubebench-dev", "mode=0755", unix.MS_NOSUID); err != nil {
		return err
	}
	for _, name := range []string{"null", "zero", "full", "random", "urandom", "tty"} {
		if err := bindInto(root, "/dev/"+name, "/dev/"+name, false, false); err != nil {
			return err
		}
	}
	shm := filepath.Join(dev, "shm")
	if err := os.MkdirAll(shm, 0o1777); err != nil {
		return err
	}
	if err := unix.Mount("kubebench-shm", shm, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=1777"); err != nil {
		return fmt.Errorf("tmpfs /dev/shm: %w", err)
	}
	for name, target := range map[string]string{
		"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2",
	} {
		if err := os.Symlink(target, filepath.Join(dev, name)); err != nil {
			return err
		}
	}
	return nil
}

// bindInto binds the node's path host at target inside root. A symlink at the top of the
// node's tree (/bin -> usr/bin) is copied as a symlink. The mount point is made only on the
// root's own tmpfs: a target inside a directory bound from the node must exist already, so
// that nothing is ever created on the node's filesystems.
func bindInto(root, host, target string, readOnly, recursive bool) error {
	st, err := os.Lstat(host)
	if err != nil {
		return fmt.Errorf("mount source %s: %w", host, err)
	}
	dst := filepath.Join(root, target)
	if st.Mode()&os.ModeSymlink != 0 && filepath.Dir(filepath.Clean(host)) == "/" {
		link, err := os.Readlink(host)
		if err != nil {
			return err
		}
		return os.Symlink(link, dst)
	}
	if err := makeMountPoint(root, dst, st.IsDir()); err != nil {
		return fmt.Errorf("mount point %s for %s: %w", target, host, err)
	}
	flags := uintptr(unix.MS_BIND)
	if recursive || st.IsDir() {
		flags |= unix.MS_REC
	}
	if err := unix.Mount(host, dst, "", flags, ""); err != nil {
		return fmt.Errorf("bind %s at %s: %w", host, target, err)
	}
	if readOnly {
		if err := unix.Mount("", dst, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			return fmt.Errorf("read-only %s: %w", target, err)
		}
	}
	return nil
}

func makeMountPoint(root, dst string, dir bool) error {
	if _, err := os.Stat(dst); err == nil {
		return nil
	}
	// The deepest existing ancestor must be on a tmpfs of the container's own (root, /dev).
	parent := filepath.Dir(dst)
	for {
		var st unix.Stat_t
		if err := unix.Stat(parent, &st); err == nil {
			if !ownFilesystems[st.Dev] {
				return fmt.Errorf("%s is on a filesystem bound from the node: refusing to create in it", parent)
			}
			break
		}
		parent = filepath.Dir(parent)
	}
	if dir {
		return os.MkdirAll(dst, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	f, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if strings.HasPrefix(kv, "PATH=") {
			path = kv[len("PATH="):]
		}
	}
	for _, dir := range filepath.SplitList(path) {
		candidate := filepath.Join(dir, name)
		if st, err := os.Stat(candidate); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return candidate, nil
		}
	}
	return "", fmt.Errorf("%s: not found in PATH %s", name, path)
}
