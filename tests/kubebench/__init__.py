"""A real kube-apiserver + etcd test bench, built from Go modules (see README.md)."""
