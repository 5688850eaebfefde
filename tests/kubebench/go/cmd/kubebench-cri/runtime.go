package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

type sandbox struct {
	id        string
	config    *runtimeapi.PodSandboxConfig
	state     runtimeapi.PodSandboxState
	createdAt int64
	ip        string
	netns     string // the namespace file; "" on the node's network
	dir       string
	forwards  []net.Listener
}

type container struct {
	id        string
	sandbox   *sandbox
	config    *runtimeapi.ContainerConfig
	image     string // the name the pod gave
	imageRef  string
	state     runtimeapi.ContainerState
	createdAt int64
	startedAt int64
	finished  int64
	exitCode  int32
	reason    string
	message   string
	logPath   string
	dir       string
	argv      []string
	env       []string
	cmd       *exec.Cmd
	done      chan struct{}
}

type runtimeServer struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	runtimeapi.UnimplementedImageServiceServer
	cfg        *Config
	mu         sync.Mutex
	sandboxes  map[string]*sandbox
	containers map[string]*container
	usedIPs    map[string]bool
	nextIP     int
}

func serve(cfg *Config) error {
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return err
	}
	_ = os.Remove(cfg.Socket)
	lis, err := net.Listen("unix", cfg.Socket)
	if err != nil {
		return err
	}
	rs := &runtimeServer{
		cfg: cfg, sandboxes: map[string]*sandbox{}, containers: map[string]*container{},
		usedIPs: map[string]bool{}, nextIP: 2,
	}
	if cfg.Gateway != "" {
		if err := startDNS(cfg); err != nil {
			return err
		}
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, rs)
	runtimeapi.RegisterImageServiceServer(srv, rs)
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-signals
		srv.Stop()
	}()
	logf("serving on %s", cfg.Socket)
	err = srv.Serve(lis)
	rs.shutdown()
	return err
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s kubebench-cri: %s\n", time.Now().UTC().Format(time.RFC3339Nano), fmt.Sprintf(format, args...))
}

// shutdown kills every container and removes every sandbox's namespace.
func (rs *runtimeServer) shutdown() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	for _, c := range rs.containers {
		rs.kill(c, 0)
	}
	for _, s := range rs.sandboxes {
		rs.teardownSandbox(s)
	}
	logf("stopped: every container killed, every pod network removed")
}

func newID() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func now() int64 { return time.Now().UnixNano() }

func notFound(kind, id string) error {
	return status.Errorf(codes.NotFound, "%s %q not found", kind, id)
}

// -- runtime info ------------------------------------------------------------------------

func (rs *runtimeServer) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{
		Version: "0.1.0", RuntimeName: "kubebench-cri", RuntimeVersion: "0.1.0", RuntimeApiVersion: "v1",
	}, nil
}

func (rs *runtimeServer) Status(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	return &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: runtimeapi.RuntimeReady, Status: true},
		{Type: runtimeapi.NetworkReady, Status: true},
	}}}, nil
}

func (rs *runtimeServer) RuntimeConfig(context.Context, *runtimeapi.RuntimeConfigRequest) (*runtimeapi.RuntimeConfigResponse, error) {
	return &runtimeapi.RuntimeConfigResponse{Linux: &runtimeapi.LinuxRuntimeConfiguration{
		CgroupDriver: runtimeapi.CgroupDriver_CGROUPFS,
	}}, nil
}

func (rs *runtimeServer) UpdateRuntimeConfig(context.Context, *runtimeapi.UpdateRuntimeConfigRequest) (*runtimeapi.UpdateRuntimeConfigResponse, error) {
	return &runtimeapi.UpdateRuntimeConfigResponse{}, nil
}

// -- images: every name is present, mapped to a local command by the config's rules -----------

func imageID(name string) string {
	sum := sha256.Sum256([]byte(name))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func (rs *runtimeServer) imageRule(name string) (ImageRule, bool) {
	for _, rule := range rs.cfg.Images {
		if globMatch(rule.Match, name) {
			return rule, true
		}
	}
	return ImageRule{}, false
}

// globMatch: shell-like, where "*" matches any run of characters, "/" and ":" included.
func globMatch(pattern, name string) bool {
	parts := strings.Split(pattern, "*")
	if len(parts) == 1 {
		return pattern == name
	}
	if !strings.HasPrefix(name, parts[0]) {
		return false
	}
	rest := name[len(parts[0]):]
	for _, part := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, part)
		if i < 0 {
			return false
		}
		rest = rest[i+len(part):]
	}
	return strings.HasSuffix(rest, parts[len(parts)-1])
}

func (rs *runtimeServer) ImageStatus(_ context.Context, req *runtimeapi.ImageStatusRequest) (*runtimeapi.ImageStatusResponse, error) {
	name := req.GetImage().GetImage()
	if _, ok := rs.imageRule(name); !ok {
		return &runtimeapi.ImageStatusResponse{}, nil
	}
	return &runtimeapi.ImageStatusResponse{Image: &runtimeapi.Image{
		Id: imageID(name), RepoTags: []string{name}, Size: 1, Spec: req.GetImage(),
	}}, nil
}

func (rs *runtimeServer) PullImage(_ context.Context, req *runtimeapi.PullImageRequest) (*runtimeapi.PullImageResponse, error) {
	name := req.GetImage().GetImage()
	if _, ok := rs.imageRule(name); !ok {
		return nil, status.Errorf(codes.NotFound, "no local command for image %q", name)
	}
	return &runtimeapi.PullImageResponse{ImageRef: imageID(name)}, nil
}

func (rs *runtimeServer) ListImages(context.Context, *runtimeapi.ListImagesRequest) (*runtimeapi.ListImagesResponse, error) {
	return &runtimeapi.ListImagesResponse{}, nil
}

func (rs *runtimeServer) RemoveImage(context.Context, *runtimeapi.RemoveImageRequest) (*runtimeapi.RemoveImageResponse, error) {
	return &runtimeapi.RemoveImageResponse{}, nil
}

func (rs *runtimeServer) ImageFsInfo(context.Context, *runtimeapi.ImageFsInfoRequest) (*runtimeapi.ImageFsInfoResponse, error) {
	return &runtimeapi.ImageFsInfoResponse{}, nil
}

// -- sandboxes ------------------------------------------------------------------------------

func (rs *runtimeServer) RunPodSandbox(_ context.Context, req *runtimeapi.RunPodSandboxRequest) (*runtimeapi.RunPodSandboxResponse, error) {
	cfg := req.GetConfig()
	s := &sandbox{id: newID(), config: cfg, createdAt: now(), state: runtimeapi.PodSandboxState_SANDBOX_READY}
	s.dir = filepath.Join(rs.cfg.StateDir, "sandboxes", s.id)
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return nil, err
	}
	if err := writeResolvConf(filepath.Join(s.dir, "resolv.conf"), cfg.GetDnsConfig()); err != nil {
		return nil, err
	}
	hostNetwork := cfg.GetLinux().GetSecurityContext().GetNamespaceOptions().GetNetwork() == runtimeapi.NamespaceMode_NODE
	if !hostNetwork {
		rs.mu.Lock()
		ip, err := rs.allocateIP()
		rs.mu.Unlock()
		if err != nil {
			return nil, err
		}
		s.ip = ip
		if err := rs.setupNetwork(s); err != nil {
			rs.teardownSandbox(s)
			return nil, status.Errorf(codes.Internal, "pod network: %v", err)
		}
	}
	rs.mu.Lock()
	rs.sandboxes[s.id] = s
	rs.mu.Unlock()
	logf("sandbox %s for %s/%s: ip %q", s.id[:12], cfg.GetMetadata().GetNamespace(), cfg.GetMetadata().GetName(), s.ip)
	return &runtimeapi.RunPodSandboxResponse{PodSandboxId: s.id}, nil
}

func writeResolvConf(file string, dns *runtimeapi.DNSConfig) error {
	var b strings.Builder
	for _, server := range dns.GetServers() {
		fmt.Fprintf(&b, "nameserver %s\n", server)
	}
	if len(dns.GetSearches()) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(dns.GetSearches(), " "))
	}
	if len(dns.GetOptions()) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(dns.GetOptions(), " "))
	}
	return os.WriteFile(file, []byte(b.String()), 0o644)
}

func (rs *runtimeServer) allocateIP() (string, error) {
	for tries := 0; tries < 253; tries++ {
		n := rs.nextIP
		rs.nextIP++
		if rs.nextIP > 254 {
			rs.nextIP = 2
		}
		ip := fmt.Sprintf("%s%d", rs.cfg.Network, n)
		if ip != rs.cfg.Gateway && !rs.usedIPs[ip] {
			rs.usedIPs[ip] = true
			return ip, nil
		}
	}
	return "", status.Error(codes.ResourceExhausted, "the pod network has no free address")
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// setupNetwork makes the sandbox's network namespace (a file held by a bind mount), a veth
// pair from it to the node's bridge, its address, and the forwarders.
func (rs *runtimeServer) setupNetwork(s *sandbox) error {
	s.netns = filepath.Join(s.dir, "netns")
	if err := os.WriteFile(s.netns, nil, 0o644); err != nil {
		return err
	}
	if err := run("unshare", "--net="+s.netns, "true"); err != nil {
		s.netns = ""
		return err
	}
	host := "kbv" + s.id[:8]
	in := func(args ...string) error {
		return run("nsenter", append([]string{"--net=" + s.netns, "--", "ip"}, args...)...)
	}
	steps := []func() error{
		func() error {
			return in("link", "add", "eth0", "type", "veth", "peer", "name", host, "netns", fmt.Sprint(os.Getpid()))
		},
		func() error { return run("ip", "link", "set", host, "master", rs.cfg.Bridge, "up") },
		func() error { return in("addr", "add", fmt.Sprintf("%s/%d", s.ip, rs.cfg.PrefixLen), "dev", "eth0") },
		func() error { return in("link", "set", "lo", "up") },
		func() error { return in("link", "set", "eth0", "up") },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	for _, fw := range rs.cfg.Forward {
		lis, err := listenIn(s.netns, fw.Listen)
		if err != nil {
			return err
		}
		s.forwards = append(s.forwards, lis)
		go forward(lis, fw.Target)
	}
	return nil
}

// teardownSandbox closes the forwarders and removes the namespace (its veth pair goes with it).
func (rs *runtimeServer) teardownSandbox(s *sandbox) {
	for _, lis := range s.forwards {
		_ = lis.Close()
	}
	s.forwards = nil
	if s.netns != "" {
		if err := syscall.Unmount(s.netns, syscall.MNT_DETACH); err != nil {
			logf("unmount %s: %v", s.netns, err)
		}
		_ = os.Remove(s.netns)
		s.netns = ""
	}
	if s.ip != "" {
		delete(rs.usedIPs, s.ip)
		s.ip = ""
	}
}

func (rs *runtimeServer) StopPodSandbox(_ context.Context, req *runtimeapi.StopPodSandboxRequest) (*runtimeapi.StopPodSandboxResponse, error) {
	rs.mu.Lock()
	s, ok := rs.sandboxes[req.GetPodSandboxId()]
	if !ok {
		rs.mu.Unlock()
		return &runtimeapi.StopPodSandboxResponse{}, nil // already removed: stopping is idempotent
	}
	var running []*container
	for _, c := range rs.containers {
		if c.sandbox == s && c.state == runtimeapi.ContainerState_CONTAINER_RUNNING {
			running = append(running, c)
		}
	}
	rs.mu.Unlock()
	for _, c := range running {
		rs.stop(c, 0)
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.teardownSandbox(s)
	s.state = runtimeapi.PodSandboxState_SANDBOX_NOTREADY
	return &runtimeapi.StopPodSandboxResponse{}, nil
}

func (rs *runtimeServer) RemovePodSandbox(ctx context.Context, req *runtimeapi.RemovePodSandboxRequest) (*runtimeapi.RemovePodSandboxResponse, error) {
	if _, err := rs.StopPodSandbox(ctx, &runtimeapi.StopPodSandboxRequest{PodSandboxId: req.GetPodSandboxId()}); err != nil {
		return nil, err
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	s, ok := rs.sandboxes[req.GetPodSandboxId()]
	if !ok {
		return &runtimeapi.RemovePodSandboxResponse{}, nil
	}
	for id, c := range rs.containers {
		if c.sandbox == s {
			_ = os.RemoveAll(c.dir)
			delete(rs.containers, id)
		}
	}
	_ = os.RemoveAll(s.dir)
	delete(rs.sandboxes, s.id)
	return &runtimeapi.RemovePodSandboxResponse{}, nil
}

func (rs *runtimeServer) sandboxStatus(s *sandbox) *runtimeapi.PodSandboxStatus {
	mode := runtimeapi.NamespaceMode_POD
	if s.config.GetLinux().GetSecurityContext().GetNamespaceOptions().GetNetwork() == runtimeapi.NamespaceMode_NODE {
		mode = runtimeapi.NamespaceMode_NODE
	}
	st := &runtimeapi.PodSandboxStatus{
		Id: s.id, Metadata: s.config.GetMetadata(), State: s.state, CreatedAt: s.createdAt,
		Labels: s.config.GetLabels(), Annotations: s.config.GetAnnotations(),
		Linux: &runtimeapi.LinuxPodSandboxStatus{Namespaces: &runtimeapi.Namespace{Options: &runtimeapi.NamespaceOption{
			Network: mode, Pid: runtimeapi.NamespaceMode_CONTAINER, Ipc: runtimeapi.NamespaceMode_POD,
		}}},
	}
	if s.ip != "" {
		st.Network = &runtimeapi.PodSandboxNetworkStatus{Ip: s.ip}
	}
	return st
}

func (rs *runtimeServer) PodSandboxStatus(_ context.Context, req *runtimeapi.PodSandboxStatusRequest) (*runtimeapi.PodSandboxStatusResponse, error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	s, ok := rs.sandboxes[req.GetPodSandboxId()]
	if !ok {
		return nil, notFound("pod sandbox", req.GetPodSandboxId())
	}
	resp := &runtimeapi.PodSandboxStatusResponse{Status: rs.sandboxStatus(s), Timestamp: now()}
	if req.GetVerbose() {
		for _, c := range rs.containers {
			if c.sandbox == s {
				resp.ContainersStatuses = append(resp.ContainersStatuses, rs.containerStatus(c))
			}
		}
	}
	return resp, nil
}

func labelsMatch(selector, labels map[string]string) bool {
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func (rs *runtimeServer) ListPodSandbox(_ context.Context, req *runtimeapi.ListPodSandboxRequest) (*runtimeapi.ListPodSandboxResponse, error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	f := req.GetFilter()
	resp := &runtimeapi.ListPodSandboxResponse{}
	for _, s := range rs.sandboxes {
		if f.GetId() != "" && !strings.HasPrefix(s.id, f.GetId()) {
			continue
		}
		if f.GetState() != nil && f.GetState().GetState() != s.state {
			continue
		}
		if !labelsMatch(f.GetLabelSelector(), s.config.GetLabels()) {
			continue
		}
		resp.Items = append(resp.Items, &runtimeapi.PodSandbox{
			Id: s.id, Metadata: s.config.GetMetadata(), State: s.state, CreatedAt: s.createdAt,
			Labels: s.config.GetLabels(), Annotations: s.config.GetAnnotations(),
		})
	}
	sort.Slice(resp.Items, func(i, j int) bool { return resp.Items[i].CreatedAt < resp.Items[j].CreatedAt })
	return resp, nil
}

// -- containers -----------------------------------------------------------------------------

func (rs *runtimeServer) CreateContainer(_ context.Context, req *runtimeapi.CreateContainerRequest) (*runtimeapi.CreateContainerResponse, error) {
	rs.mu.Lock()
	s, ok := rs.sandboxes[req.GetPodSandboxId()]
	rs.mu.Unlock()
	if !ok {
		return nil, notFound("pod sandbox", req.GetPodSandboxId())
	}
	cfg := req.GetConfig()
	image := cfg.GetImage().GetUserSpecifiedImage()
	if image == "" {
		image = cfg.GetImage().GetImage()
	}
	rule, ok := rs.imageRule(image)
	if !ok {
		return nil, status.Errorf(codes.NotFound, "no local command for image %q", image)
	}
	// Docker's rule: command replaces the entrypoint, args replace the (empty) CMD.
	argv := append([]string{}, rule.Entrypoint...)
	if len(cfg.GetCommand()) > 0 {
		argv = append([]string{}, cfg.GetCommand()...)
	}
	argv = append(argv, cfg.GetArgs()...)
	env := append([]string{}, rule.Env...)
	for _, kv := range cfg.GetEnvs() {
		env = append(env, kv.GetKey()+"="+string(kv.GetValue()))
	}
	if !hasEnv(env, "PATH") {
		env = append(env, "PATH="+os.Getenv("PATH"))
	}
	env = append(env, "HOSTNAME="+s.config.GetHostname())
	c := &container{
		id: newID(), sandbox: s, config: cfg, image: image, imageRef: imageID(image),
		state: runtimeapi.ContainerState_CONTAINER_CREATED, createdAt: now(),
		argv: argv, env: env, done: make(chan struct{}),
	}
	c.dir = filepath.Join(rs.cfg.StateDir, "containers", c.id)
	if err := os.MkdirAll(filepath.Join(c.dir, "root"), 0o755); err != nil {
		return nil, err
	}
	if s.config.GetLogDirectory() != "" && cfg.GetLogPath() != "" {
		c.logPath = filepath.Join(s.config.GetLogDirectory(), cfg.GetLogPath())
	}
	rs.mu.Lock()
	rs.containers[c.id] = c
	rs.mu.Unlock()
	return &runtimeapi.CreateContainerResponse{ContainerId: c.id}, nil
}

func hasEnv(env []string, key string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			return true
		}
	}
	return false
}

func (rs *runtimeServer) initSpec(c *container) initSpec {
	workingDir := c.config.GetWorkingDir()
	if workingDir == "" {
		if rule, ok := rs.imageRule(c.image); ok {
			workingDir = rule.WorkingDir
		}
	}
	spec := initSpec{
		NetNS: c.sandbox.netns, Hostname: c.sandbox.config.GetHostname(), Root: filepath.Join(c.dir, "root"),
		ReadOnly: rs.cfg.ReadOnly, Writable: rs.cfg.Writable, Argv: c.argv, Env: c.env, Dir: workingDir,
	}
	hasResolv := false
	for _, m := range c.config.GetMounts() {
		spec.Mounts = append(spec.Mounts, initMount{Host: m.GetHostPath(), Container: m.GetContainerPath(), ReadOnly: m.GetReadonly()})
		hasResolv = hasResolv || m.GetContainerPath() == "/etc/resolv.conf"
	}
	if !hasResolv && c.sandbox.netns != "" {
		spec.Mounts = append(spec.Mounts, initMount{
			Host: filepath.Join(c.sandbox.dir, "resolv.conf"), Container: "/etc/resolv.conf", ReadOnly: true,
		})
	}
	return spec
}

func (rs *runtimeServer) StartContainer(_ context.Context, req *runtimeapi.StartContainerRequest) (*runtimeapi.StartContainerResponse, error) {
	rs.mu.Lock()
	c, ok := rs.containers[req.GetContainerId()]
	rs.mu.Unlock()
	if !ok {
		return nil, notFound("container", req.GetContainerId())
	}
	if c.state != runtimeapi.ContainerState_CONTAINER_CREATED {
		return nil, status.Errorf(codes.FailedPrecondition, "container %s is not created", c.id)
	}
	specFile := filepath.Join(c.dir, "init.json")
	data, _ := json.Marshal(rs.initSpec(c))
	if err := os.WriteFile(specFile, data, 0o600); err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, "init", specFile)
	cmd.Env = c.env
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWNS | syscall.CLONE_NEWUTS,
		Setsid:     true,
		Pdeathsig:  syscall.SIGKILL,
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	logw, err := openLog(c.logPath)
	if err != nil {
		return nil, err
	}
	if err := startOnSpawner(cmd); err != nil {
		logw.Close()
		return nil, status.Errorf(codes.Internal, "start %v: %v", c.argv, err)
	}
	rs.mu.Lock()
	c.cmd = cmd
	c.state = runtimeapi.ContainerState_CONTAINER_RUNNING
	c.startedAt = now()
	rs.mu.Unlock()
	var copying sync.WaitGroup
	copying.Add(2)
	go logStream(logw, "stdout", stdout, &copying)
	go logStream(logw, "stderr", stderr, &copying)
	go rs.wait(c, logw, &copying)
	logf("container %s (%s) started: pid %d, %v", c.id[:12], c.config.GetMetadata().GetName(), cmd.Process.Pid, c.argv)
	return &runtimeapi.StartContainerResponse{}, nil
}

// spawns carries container processes to the spawner, the one OS thread that starts them all.
// Pdeathsig (PR_SET_PDEATHSIG) fires when the *thread* that forked the child ends, not the
// process (golang/go#27505), and the Go runtime does end threads: a goroutine that locked its
// thread to enter a pod's network namespace (listenIn) ends with it. A container started from
// a thread that later ran such a goroutine was SIGKILLed when another pod's sandbox was made
// (seen on the bench: a driver and its marker sidecar exited 137 as its executor pod's sandbox
// came up). The spawner's thread is locked and never ends, so Pdeathsig fires only when the
// runtime itself dies, as meant.
var spawns = make(chan spawn)

type spawn struct {
	cmd  *exec.Cmd
	done chan error
}

func init() {
	go func() {
		runtime.LockOSThread() // never unlocked: the thread lives as long as the process
		for s := range spawns {
			s.done <- s.cmd.Start()
		}
	}()
}

// startOnSpawner starts cmd from the spawner's thread.
func startOnSpawner(cmd *exec.Cmd) error {
	done := make(chan error, 1)
	spawns <- spawn{cmd: cmd, done: done}
	return <-done
}

// wait records the container's exit, then kills what is left of its process group (as the end
// of a container's PID namespace would).
func (rs *runtimeServer) wait(c *container, logw *logWriter, copying *sync.WaitGroup) {
	err := c.cmd.Wait()
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	copied := make(chan struct{})
	go func() { copying.Wait(); close(copied) }()
	select { // a process that left the group may hold the pipes: the log ends anyway
	case <-copied:
	case <-time.After(5 * time.Second):
	}
	logw.Close()
	code := int32(0)
	if ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
		switch {
		case ws.Signaled():
			code = 128 + int32(ws.Signal())
		default:
			code = int32(ws.ExitStatus())
		}
	} else if err != nil {
		code = 1
	}
	rs.mu.Lock()
	c.state = runtimeapi.ContainerState_CONTAINER_EXITED
	c.finished = now()
	c.exitCode = code
	if code == 0 {
		c.reason = "Completed"
	} else {
		c.reason = "Error"
	}
	rs.mu.Unlock()
	close(c.done)
	logf("container %s (%s) exited: %d", c.id[:12], c.config.GetMetadata().GetName(), code)
}

func stopSignal(c *container) syscall.Signal {
	if sig := c.config.GetStopSignal(); sig != runtimeapi.Signal_SIGNAL_RUNTIME_DEFAULT {
		if n, ok := signalNumbers[strings.TrimPrefix(sig.String(), "SIGNAL_")]; ok {
			return n
		}
	}
	return syscall.SIGTERM
}

var signalNumbers = map[string]syscall.Signal{
	"SIGHUP": syscall.SIGHUP, "SIGINT": syscall.SIGINT, "SIGQUIT": syscall.SIGQUIT,
	"SIGKILL": syscall.SIGKILL, "SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2,
	"SIGTERM": syscall.SIGTERM,
}

// stop sends the stop signal to the container's process group, then SIGKILL after timeout
// seconds; it returns once the container exited.
func (rs *runtimeServer) stop(c *container, timeout int64) {
	rs.mu.Lock()
	running := c.cmd != nil && c.state == runtimeapi.ContainerState_CONTAINER_RUNNING
	rs.mu.Unlock()
	if !running {
		return
	}
	if timeout > 0 {
		_ = syscall.Kill(-c.cmd.Process.Pid, stopSignal(c))
		select {
		case <-c.done:
			return
		case <-time.After(time.Duration(timeout) * time.Second):
		}
	}
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	<-c.done
}

// kill is stop without grace and without waiting (rs.mu held).
func (rs *runtimeServer) kill(c *container, _ int64) {
	if c.cmd != nil && c.state == runtimeapi.ContainerState_CONTAINER_RUNNING {
		_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	}
}

func (rs *runtimeServer) StopContainer(_ context.Context, req *runtimeapi.StopContainerRequest) (*runtimeapi.StopContainerResponse, error) {
	rs.mu.Lock()
	c, ok := rs.containers[req.GetContainerId()]
	rs.mu.Unlock()
	if !ok {
		return nil, notFound("container", req.GetContainerId())
	}
	rs.stop(c, req.GetTimeout())
	rs.mu.Lock()
	if c.state == runtimeapi.ContainerState_CONTAINER_CREATED {
		c.state = runtimeapi.ContainerState_CONTAINER_EXITED
		c.finished = now()
	}
	rs.mu.Unlock()
	return &runtimeapi.StopContainerResponse{}, nil
}

func (rs *runtimeServer) RemoveContainer(_ context.Context, req *runtimeapi.RemoveContainerRequest) (*runtimeapi.RemoveContainerResponse, error) {
	rs.mu.Lock()
	c, ok := rs.containers[req.GetContainerId()]
	rs.mu.Unlock()
	if !ok {
		return &runtimeapi.RemoveContainerResponse{}, nil
	}
	rs.stop(c, 0)
	rs.mu.Lock()
	delete(rs.containers, c.id)
	rs.mu.Unlock()
	_ = os.RemoveAll(c.dir)
	return &runtimeapi.RemoveContainerResponse{}, nil
}

func (rs *runtimeServer) ListContainers(_ context.Context, req *runtimeapi.ListContainersRequest) (*runtimeapi.ListContainersResponse, error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	f := req.GetFilter()
	resp := &runtimeapi.ListContainersResponse{}
	for _, c := range rs.containers {
		if f.GetId() != "" && !strings.HasPrefix(c.id, f.GetId()) {
			continue
		}
		if f.GetPodSandboxId() != "" && !strings.HasPrefix(c.sandbox.id, f.GetPodSandboxId()) {
			continue
		}
		if f.GetState() != nil && f.GetState().GetState() != c.state {
			continue
		}
		if !labelsMatch(f.GetLabelSelector(), c.config.GetLabels()) {
			continue
		}
		resp.Containers = append(resp.Containers, &runtimeapi.Container{
			Id: c.id, PodSandboxId: c.sandbox.id, Metadata: c.config.GetMetadata(),
			Image: c.config.GetImage(), ImageRef: c.imageRef, ImageId: c.imageRef, State: c.state,
			CreatedAt: c.createdAt, Labels: c.config.GetLabels(), Annotations: c.config.GetAnnotations(),
		})
	}
	sort.Slice(resp.Containers, func(i, j int) bool { return resp.Containers[i].CreatedAt < resp.Containers[j].CreatedAt })
	return resp, nil
}

func (rs *runtimeServer) containerStatus(c *container) *runtimeapi.ContainerStatus {
	var mounts []*runtimeapi.Mount
	mounts = append(mounts, c.config.GetMounts()...)
	return &runtimeapi.ContainerStatus{
		Id: c.id, Metadata: c.config.GetMetadata(), State: c.state, CreatedAt: c.createdAt,
		StartedAt: c.startedAt, FinishedAt: c.finished, ExitCode: c.exitCode,
		Image: c.config.GetImage(), ImageRef: c.imageRef, ImageId: c.imageRef, Reason: c.reason, Message: c.message,
		Labels: c.config.GetLabels(), Annotations: c.config.GetAnnotations(), Mounts: mounts, LogPath: c.logPath,
	}
}

func (rs *runtimeServer) ContainerStatus(_ context.Context, req *runtimeapi.ContainerStatusRequest) (*runtimeapi.ContainerStatusResponse, error) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	c, ok := rs.containers[req.GetContainerId()]
	if !ok {
		return nil, notFound("container", req.GetContainerId())
	}
	return &runtimeapi.ContainerStatusResponse{Status: rs.containerStatus(c)}, nil
}

func (rs *runtimeServer) UpdateContainerResources(context.Context, *runtimeapi.UpdateContainerResourcesRequest) (*runtimeapi.UpdateContainerResourcesResponse, error) {
	return &runtimeapi.UpdateContainerResourcesResponse{}, nil
}

func (rs *runtimeServer) ReopenContainerLog(context.Context, *runtimeapi.ReopenContainerLogRequest) (*runtimeapi.ReopenContainerLogResponse, error) {
	return &runtimeapi.ReopenContainerLogResponse{}, nil
}

// ExecSync runs cmd in the container's namespaces (mount, network, UTS, root) with its
// environment, and kills it at the timeout.
func (rs *runtimeServer) ExecSync(ctx context.Context, req *runtimeapi.ExecSyncRequest) (*runtimeapi.ExecSyncResponse, error) {
	rs.mu.Lock()
	c, ok := rs.containers[req.GetContainerId()]
	running := ok && c.state == runtimeapi.ContainerState_CONTAINER_RUNNING
	rs.mu.Unlock()
	if !ok {
		return nil, notFound("container", req.GetContainerId())
	}
	if !running || len(req.GetCmd()) == 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "container %s is not running", c.id)
	}
	if req.GetTimeout() > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(req.GetTimeout())*time.Second)
		defer cancel()
	}
	pid := fmt.Sprint(c.cmd.Process.Pid)
	args := append([]string{"--target", pid, "--mount", "--net", "--uts", "--root", "--wd", "--"}, req.GetCmd()...)
	cmd := exec.CommandContext(ctx, "nsenter", args...)
	cmd.Env = c.env
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := int32(0)
	if err != nil {
		if exitErr, ok := err.(*exec.ExitError); ok {
			code = int32(exitErr.ExitCode())
		} else {
			return nil, status.Errorf(codes.Internal, "exec: %v", err)
		}
		if ctx.Err() == context.DeadlineExceeded {
			return nil, status.Errorf(codes.DeadlineExceeded, "exec %v timed out", req.GetCmd())
		}
	}
	return &runtimeapi.ExecSyncResponse{Stdout: []byte(stdout.String()), Stderr: []byte(stderr.String()), ExitCode: code}, nil
}

// -- logs: the CRI format (<RFC3339Nano> <stream> <P|F> <text>) ------------------------------

type logWriter struct {
	mu sync.Mutex
	f  *os.File
}

func openLog(file string) (*logWriter, error) {
	if file == "" {
		return &logWriter{}, nil
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		return nil, err
	}
	return &logWriter{f: f}, nil
}

func (w *logWriter) write(stream string, partial bool, text []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f == nil {
		return
	}
	tag := "F"
	if partial {
		tag = "P"
	}
	fmt.Fprintf(w.f, "%s %s %s %s\n", time.Now().UTC().Format(time.RFC3339Nano), stream, tag, text)
}

func (w *logWriter) Close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.f != nil {
		_ = w.f.Close()
		w.f = nil
	}
}

func logStream(w *logWriter, stream string, r io.Reader, done *sync.WaitGroup) {
	defer done.Done()
	br := bufio.NewReaderSize(r, 16*1024)
	for {
		line, isPrefix, err := br.ReadLine()
		if len(line) > 0 || (err == nil && !isPrefix) {
			w.write(stream, isPrefix, line)
		}
		if err != nil {
			return
		}
	}
}
