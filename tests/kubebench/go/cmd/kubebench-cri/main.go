// Command kubebench-cri is the container runtime of the kube bench's node: a CRI (v1) server
// for the real kubelet that runs every container as a local process.
//
//   - A pod sandbox is a network namespace of its own (a persistent namespace file under the
//     state directory), joined by a veth pair to a bridge of the node, with one address of the
//     node's pod network and no default route: pods reach each other and the node, nothing
//     else. A forwarder per sandbox makes the API server reachable inside the pod at the address
//     the node uses (127.0.0.1:<port>) and at 127.0.0.1:443, where the DNS server sends
//     kubernetes.default.svc: what kube-proxy and cluster DNS do for the kubernetes Service,
//     without its cluster IP (an address no packet of the bench may go to).
//   - A container is a process (its own session) in its pod's network namespace, with a mount
//     namespace and a UTS namespace of its own: a tmpfs root into which the node's system
//     directories are bound (read-only except those named writable), then the kubelet's mounts
//     (volumes, /etc/hosts, termination log) and the sandbox's resolv.conf, then chroot. Images
//     map to local commands by name (config "images"): an entrypoint and environment per image.
//   - Stop sends the stop signal (SIGTERM unless the container names one) to the container's
//     process group and SIGKILL after the timeout; status carries exit code, reason and times;
//     logs are CRI-format files where the kubelet asks; ExecSync runs in the container's
//     namespaces (nsenter).
//   - A small DNS server on the node's bridge address answers <service>.<namespace>.svc.<domain>
//     with the addresses of the Service's EndpointSlices (read from the API server), the
//     config's fixed names (kubernetes.default.svc) with theirs, and nothing else: no name is
//     ever forwarded anywhere.
//
// Usage: kubebench-cri serve --config FILE   (the bench starts it beside the kubelet)
//
//	kubebench-cri init SPECFILE              (internal: the first process of a container)
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
)

// The main goroutine keeps the main thread to itself: a goroutine that enters a pod's network
// namespace (listenIn) locks its thread and ends with it, but the runtime never ends the main
// thread; were it the one, the main thread (whose namespace /proc/<pid>/ns/net and every
// command the runtime starts from it see) would stay in the pod's namespace.
func init() { runtime.LockOSThread() }

func main() {
	if len(os.Args) == 3 && os.Args[1] == "init" {
		containerInit(os.Args[2]) // does not return
	}
	if len(os.Args) == 4 && os.Args[1] == "serve" && os.Args[2] == "--config" {
		cfg, err := loadConfig(os.Args[3])
		if err != nil {
			fmt.Fprintln(os.Stderr, "kubebench-cri:", err)
			os.Exit(2)
		}
		if err := serve(cfg); err != nil {
			fmt.Fprintln(os.Stderr, "kubebench-cri:", err)
			os.Exit(1)
		}
		return
	}
	fmt.Fprintln(os.Stderr, "usage: kubebench-cri serve --config FILE")
	os.Exit(2)
}

// Config is what the bench writes for the runtime (JSON).
type Config struct {
	// Socket is the unix socket the kubelet dials (containerRuntimeEndpoint).
	Socket string `json:"socket"`
	// StateDir holds sandboxes (namespace files, resolv.conf) and container roots.
	StateDir string `json:"stateDir"`
	// Bridge is the node's bridge (made by the bench) that pod veths join.
	Bridge string `json:"bridge"`
	// Network is the pod network's prefix ("192.0.2.") and PrefixLen its length (24); the
	// Gateway (the bridge's address) is the DNS server's address.
	Network   string `json:"network"`
	PrefixLen int    `json:"prefixLen"`
	Gateway   string `json:"gateway"`
	// Forward: inside every pod, listen on Listen and relay each connection to Target (a node
	// address): the API server at its own 127.0.0.1 port and at 127.0.0.1:443, where
	// kubernetes.default.svc leads (Hosts).
	Forward []Forward `json:"forward"`
	// Hosts: names the DNS server answers with a fixed address.
	Hosts map[string]string `json:"hosts"`
	// APIServer, Token and CAFile: how the DNS server reads EndpointSlices.
	APIServer     string `json:"apiServer"`
	Token         string `json:"token"`
	CAFile        string `json:"caFile"`
	ClusterDomain string `json:"clusterDomain"`
	// ReadOnly and Writable: the node's paths bound into every container's root.
	ReadOnly []string `json:"readOnly"`
	Writable []string `json:"writable"`
	// Images: the first whose Match (a shell pattern) matches the image name gives its
	// entrypoint and environment.
	Images []ImageRule `json:"images"`
}

// Forward is one relay into the pods.
type Forward struct {
	Listen string `json:"listen"`
	Target string `json:"target"`
}

// ImageRule maps image names to a local command, as an image's ENTRYPOINT and ENV would.
type ImageRule struct {
	Match      string   `json:"match"`
	Entrypoint []string `json:"entrypoint"`
	Env        []string `json:"env"`
	WorkingDir string   `json:"workingDir"`
}

func loadConfig(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	cfg := &Config{}
	if err := json.Unmarshal(data, cfg); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if cfg.Socket == "" || cfg.StateDir == "" {
		return nil, fmt.Errorf("%s: socket and stateDir are required", path)
	}
	return cfg, nil
}
