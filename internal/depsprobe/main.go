package main

import (
	_ "github.com/eclipse/paho.mqtt.golang"
	_ "github.com/google/cadvisor/lib/manager"
	_ "github.com/mochi-mqtt/server/v2"
	_ "github.com/rs/zerolog"
	_ "go.etcd.io/bbolt"
	_ "k8s.io/api/core/v1"
	_ "k8s.io/apimachinery/pkg/util/validation/field"
	_ "k8s.io/client-go/util/flowcontrol"
	_ "k8s.io/client-go/util/workqueue"
	_ "k8s.io/cri-api/pkg/apis/runtime/v1"
	_ "k8s.io/cri-client/pkg"
	_ "k8s.io/klog/v2"
	_ "k8s.io/kubelet/pkg/apis/stats/v1alpha1"
	_ "k8s.io/kubernetes/pkg/apis/core/v1"
	_ "k8s.io/kubernetes/pkg/apis/core/validation"
	_ "sigs.k8s.io/yaml"
)

func main() {}
