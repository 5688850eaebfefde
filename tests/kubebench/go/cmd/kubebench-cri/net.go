package main

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// listenIn opens a TCP listener on addr inside the network namespace file netns. The thread
// that enters the namespace stays locked and ends with its goroutine, so no other goroutine
// ever runs in the pod's namespace; the listener works from any thread once open.
func listenIn(netns, addr string) (net.Listener, error) {
	type result struct {
		lis net.Listener
		err error
	}
	out := make(chan result, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with this goroutine
		fd, err := unix.Open(netns, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			out <- result{nil, err}
			return
		}
		defer unix.Close(fd)
		if err := unix.Setns(fd, unix.CLONE_NEWNET); err != nil {
			out <- result{nil, err}
			return
		}
		lis, err := net.Listen("tcp", addr)
		out <- result{lis, err}
	}()
	r := <-out
	if r.err != nil {
		return nil, fmt.Errorf("listen on %s in %s: %w", addr, netns, r.err)
	}
	return r.lis, nil
}

// forward relays every connection accepted on lis to target, dialled from the node.
func forward(lis net.Listener, target string) {
	for {
		conn, err := lis.Accept()
		if err != nil {
			return // closed with its sandbox
		}
		go func() {
			defer conn.Close()
			upstream, err := net.DialTimeout("tcp", target, 10*time.Second)
			if err != nil {
				logf("forward to %s: %v", target, err)
				return
			}
			defer upstream.Close()
			done := make(chan struct{}, 2)
			go func() { _, _ = io.Copy(upstream, conn); done <- struct{}{} }()
			go func() { _, _ = io.Copy(conn, upstream); done <- struct{}{} }()
			<-done
		}()
	}
}

// -- DNS: <service>.<namespace>.svc.<domain> -> the Service's endpoint addresses; the names of
// the config's Hosts -> their address; every other name: NXDOMAIN ------------------------------

type dnsServer struct {
	cfg    *Config
	client *http.Client
}

func startDNS(cfg *Config) error {
	pool := x509.NewCertPool()
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return err
		}
		pool.AppendCertsFromPEM(pem)
	}
	d := &dnsServer{cfg: cfg, client: &http.Client{
		Timeout:   5 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, Proxy: nil},
	}}
	conn, err := net.ListenPacket("udp", net.JoinHostPort(cfg.Gateway, "53"))
	if err != nil {
		return fmt.Errorf("dns: %w", err)
	}
	go d.serve(conn)
	return nil
}

func (d *dnsServer) serve(conn net.PacketConn) {
	buf := make([]byte, 1500)
	for {
		n, addr, err := conn.ReadFrom(buf)
		if err != nil {
			return
		}
		query := append([]byte{}, buf[:n]...)
		go func() {
			if reply := d.answer(query); reply != nil {
				_, _ = conn.WriteTo(reply, addr)
			}
		}()
	}
}

// answer builds the reply to one query: A records for a Service's endpoints, an empty answer
// for other types of a known name, NXDOMAIN for every other name.
func (d *dnsServer) answer(q []byte) []byte {
	if len(q) < 12 || binary.BigEndian.Uint16(q[4:6]) != 1 {
		return nil
	}
	labels, end := []string{}, 12
	for end < len(q) && q[end] != 0 {
		l := int(q[end])
		if l > 63 || end+1+l > len(q) {
			return nil
		}
		labels = append(labels, strings.ToLower(string(q[end+1:end+1+l])))
		end += 1 + l
	}
	end++ // the root label
	if end+4 > len(q) {
		return nil
	}
	qtype := binary.BigEndian.Uint16(q[end : end+2])
	question := q[12 : end+4]
	ips, known := d.lookup(labels)
	reply := make([]byte, 12, 512)
	copy(reply, q[:2])
	flags := uint16(0x8400) | (binary.BigEndian.Uint16(q[2:4]) & 0x0100) // QR, AA, RD copied
	if !known {
		flags |= 3 // NXDOMAIN
	}
	binary.BigEndian.PutUint16(reply[2:4], flags)
	binary.BigEndian.PutUint16(reply[4:6], 1)
	reply = append(reply, question...)
	count := 0
	if qtype == 1 {
		for _, ip := range ips {
			v4 := net.ParseIP(ip).To4()
			if v4 == nil {
				continue
			}
			reply = append(reply, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 5, 0, 4)
			reply = append(reply, v4...)
			count++
		}
	}
	binary.BigEndian.PutUint16(reply[6:8], uint16(count))
	return reply
}

// lookup: ([service, namespace, "svc", domain...]) -> the ready endpoint addresses.
func (d *dnsServer) lookup(labels []string) ([]string, bool) {
	if ip, ok := d.cfg.Hosts[strings.Join(labels, ".")]; ok {
		return []string{ip}, true
	}
	domain := strings.Split(strings.Trim(d.cfg.ClusterDomain, "."), ".")
	if len(labels) != 3+len(domain) || labels[2] != "svc" || strings.Join(labels[3:], ".") != strings.Join(domain, ".") {
		return nil, false
	}
	service, namespace := labels[0], labels[1]
	u := fmt.Sprintf("%s/apis/discovery.k8s.io/v1/namespaces/%s/endpointslices?labelSelector=%s",
		d.cfg.APIServer, url.PathEscape(namespace), url.QueryEscape("kubernetes.io/service-name="+service))
	req, err := http.NewRequest(http.MethodGet, u, nil)
	if err != nil {
		return nil, false
	}
	req.Header.Set("Authorization", "Bearer "+d.cfg.Token)
	resp, err := d.client.Do(req)
	if err != nil {
		logf("dns: %v", err)
		return nil, false
	}
	defer resp.Body.Close()
	var list struct {
		Items []struct {
			Endpoints []struct {
				Addresses  []string `json:"addresses"`
				Conditions struct {
					Ready *bool `json:"ready"`
				} `json:"conditions"`
			} `json:"endpoints"`
		} `json:"items"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&list) != nil {
		return nil, false
	}
	var ips []string
	for _, slice := range list.Items {
		for _, ep := range slice.Endpoints {
			if ep.Conditions.Ready == nil || *ep.Conditions.Ready {
				ips = append(ips, ep.Addresses...)
			}
		}
	}
	return ips, len(list.Items) > 0
}
