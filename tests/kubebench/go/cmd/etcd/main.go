// Command etcd is the upstream etcd server, built from go.etcd.io/etcd/server/v3
// at the exact version that k8s.io/kubernetes requires (same module graph).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
