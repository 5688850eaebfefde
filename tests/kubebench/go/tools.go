//go:build tools

// Package tools records the binaries this module builds so that `go mod tidy`
// keeps their dependencies in go.mod/go.sum. Build them with:
//
//	go build -o bin/ k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
//		k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet ./cmd/etcd ./cmd/kubebench-cri
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
