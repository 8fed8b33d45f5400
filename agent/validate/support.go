package validate

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// Support is what mqlet does with a field of a pod's spec.
type Support string

// The three answers the support table gives. Nothing is accepted and then
// ignored unless the kubelet would ignore it too on a single node.
const (
	Honoured Support = "honoured"
	Rejected Support = "rejected"
	Ignored  Support = "ignored"
)

// rule is one row of the support table.
type rule struct {
	support Support
	// why is, for a rejected field, the Forbidden detail a pod setting it
	// gets (keep its "mqlet does not ..." form: replies are matched on it);
	// for an ignored field, why the kubelet ignores it too; for an honoured
	// one, an optional note.
	why string
	// allowed, for a rejected field, accepts the values that are honoured
	// nonetheless (the API default, say); unless describes them.
	allowed func(v reflect.Value) bool
	unless  string
	// allowedAt is allowed for values honoured only at some paths.
	allowedAt func(path string, v reflect.Value) bool
}

func honoured(note string) rule { return rule{support: Honoured, why: note} }
func rejected(why string) rule  { return rule{support: Rejected, why: why} }
func ignored(why string) rule   { return rule{support: Ignored, why: why} }

// except keeps a rejected field's values that allowed accepts.
func (r rule) except(unless string, allowed func(v reflect.Value) bool) rule {
	r.unless, r.allowed = unless, allowed
	return r
}

// exceptAt is except for values honoured only at some paths.
func (r rule) exceptAt(unless string, allowed func(path string, v reflect.Value) bool) rule {
	r.unless, r.allowedAt = unless, allowed
	return r
}

// sidecarPolicy accepts restartPolicy Always on an init container: a
// sidecar.
func sidecarPolicy(path string, v reflect.Value) bool {
	return strings.HasPrefix(path, "spec.initContainers[") && v.String() == string(v1.ContainerRestartPolicyAlways)
}

func stringIn(values ...string) func(reflect.Value) bool {
	return func(v reflect.Value) bool { return slices.Contains(values, v.String()) }
}

// keysIn accepts a map (a v1.ResourceList) whose keys are all in keys.
func keysIn(keys ...string) func(reflect.Value) bool {
	return func(v reflect.Value) bool {
		for _, k := range v.MapKeys() {
			if !slices.Contains(keys, k.String()) {
				return false
			}
		}
		return true
	}
}

// supportedFieldRefs are the fieldRef paths the runtime resolves for env.
var supportedFieldRefs = []string{"metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels", "metadata.annotations",
	"spec.nodeName", "spec.serviceAccountName", "status.hostIP", "status.hostIPs", "status.podIP", "status.podIPs"}

func fieldRefSupported(v reflect.Value) bool {
	p := v.String()
	if slices.Contains(supportedFieldRefs, p) {
		return true
	}
	for _, prefix := range []string{"metadata.labels['", "metadata.annotations['"} {
		if strings.HasPrefix(p, prefix) && strings.HasSuffix(p, "']") {
			return true
		}
	}
	return false
}

const (
	notScheduled = "the scheduler's concern; the kubelet ignores it, and a pod sent to mqlet is already on its node"
	noAPIServer  = "mqlet has no API server"
	windowsOnly  = "for Windows pods; a Linux kubelet ignores it"
)

func unsupportedVolume(name string) rule {
	return rejected("mqlet does not support " + name + " volumes")
}

//go:generate go test -run TestPodFieldsDoc -update .

// supportTable has one row per field of v1.PodSpec and of every type below
// a field it honours, keyed "<Go type>.<json name>". A field of a rejected
// or ignored row is refused or skipped whole, so its type needs no rows
// (some are written already, see the end). Flipping a field to honoured is a
// change of its row (TestSupportTableCovers then lists any rows its type
// still needs). docs/pod-fields.md is generated from
// it (TestPodFieldsDoc). Read only.
var supportTable = supportRules{
	// PodSpec
	"PodSpec.volumes":                       honoured(""),
	"PodSpec.initContainers":                honoured("run one at a time, in order, to success"),
	"PodSpec.containers":                    honoured(""),
	"PodSpec.ephemeralContainers":           rejected("mqlet does not support ephemeral containers (" + noAPIServer + " to add them through)"),
	"PodSpec.restartPolicy":                 honoured(""),
	"PodSpec.terminationGracePeriodSeconds": honoured(""),
	"PodSpec.activeDeadlineSeconds":         honoured("counted from status.startTime; past it the pod's containers are stopped (Killing) and it is Failed with reason DeadlineExceeded, never restarted"),
	"PodSpec.dnsPolicy":                     honoured("mqlet runs no cluster DNS: ClusterFirst resolves as Default, as a kubelet without clusterDNS does"),
	"PodSpec.nodeSelector":                  honoured("checked against the node's labels at admission (NodeAffinity)"),
	"PodSpec.serviceAccountName":            honoured("visible through fieldRef; no token is mounted (" + noAPIServer + ")"),
	"PodSpec.serviceAccount":                honoured("deprecated alias of serviceAccountName"),
	"PodSpec.automountServiceAccountToken":  ignored("the API server's ServiceAccount admission mounts the token, not the kubelet; " + noAPIServer),
	"PodSpec.nodeName":                      honoured("must be empty or this node's name"),
	"PodSpec.hostNetwork":                   honoured("if admission allows it"),
	"PodSpec.hostPID":                       honoured("if admission allows it"),
	"PodSpec.hostIPC":                       honoured("if admission allows it"),
	"PodSpec.shareProcessNamespace":         honoured(""),
	"PodSpec.securityContext":               honoured(""),
	"PodSpec.imagePullSecrets":              honoured(""),
	"PodSpec.hostname":                      honoured(""),
	"PodSpec.subdomain":                     honoured("the pod's FQDN in its /etc/hosts (cluster domain cluster.local)"),
	"PodSpec.affinity":                      honoured(""),
	"PodSpec.schedulerName":                 ignored(notScheduled),
	"PodSpec.tolerations":                   ignored("the node has no taints, so there is nothing to tolerate"),
	"PodSpec.hostAliases":                   honoured("written into the pod's /etc/hosts"),
	"PodSpec.priorityClassName":             ignored("resolved into priority by the API server; the kubelet ignores the name"),
	"PodSpec.priority":                      ignored("the kubelet uses it only to evict and preempt, and mqlet does neither"),
	"PodSpec.dnsConfig":                     honoured(""),
	"PodSpec.readinessGates":                rejected("mqlet does not support readinessGates (" + noAPIServer + " through which a controller could set their conditions, so the pod would never be Ready)"),
	"PodSpec.runtimeClassName":              honoured("a class of runtime.classes in the node's config (not applied over MQTT: its handler must exist in the runtime's own config); its handler runs the sandbox, its nodeSelector is matched at admission (NodeAffinity); an unknown class is refused naming it"),
	"PodSpec.enableServiceLinks":            ignored("there are no Services to link without an API server"),
	"PodSpec.preemptionPolicy":              ignored(notScheduled),
	"PodSpec.overhead":                      honoured("set from the pod's RuntimeClass, as the RuntimeClass admission does (another value, or one without a class, is refused), and counted with the requests at admission"),
	"PodSpec.topologySpreadConstraints":     ignored(notScheduled),
	"PodSpec.setHostnameAsFQDN":             honoured("64-character limit as the kubelet's"),
	"PodSpec.os":                            honoured("linux only (PodOSNotSupported otherwise)"),
	"PodSpec.hostUsers":                     honoured("true only: mqlet makes no user namespace, hostUsers: false is refused"),
	"PodSpec.schedulingGates":               rejected("mqlet does not support schedulingGates (there is no scheduler to remove them)"),
	"PodSpec.resourceClaims":                rejected("mqlet does not support resourceClaims (dynamic resource allocation)"),
	"PodSpec.resources":                     honoured("cpu and memory only, written into the pod's cgroup (memory limit, CFS quota, shares) before its sandbox; admission counts its requests"),
	"PodSpec.hostnameOverride":              rejected("mqlet does not support hostnameOverride"),
	"PodSpec.schedulingGroup":               rejected("mqlet does not support schedulingGroup (gang scheduling)"),
	"PodSpec.evictionResponders":            rejected("mqlet does not support evictionResponders"),

	// Volumes: emptyDir, hostPath, configMap and secret are mounted.
	"Volume.name":                        honoured(""),
	"VolumeSource.hostPath":              honoured("only beneath admission's allowedHostPaths"),
	"VolumeSource.emptyDir":              honoured("a directory on the node's disk, or a tmpfs of its own for medium Memory"),
	"VolumeSource.gcePersistentDisk":     unsupportedVolume("gcePersistentDisk"),
	"VolumeSource.awsElasticBlockStore":  unsupportedVolume("awsElasticBlockStore"),
	"VolumeSource.gitRepo":               unsupportedVolume("gitRepo"),
	"VolumeSource.secret":                honoured(""),
	"VolumeSource.nfs":                   unsupportedVolume("nfs"),
	"VolumeSource.iscsi":                 unsupportedVolume("iscsi"),
	"VolumeSource.glusterfs":             unsupportedVolume("glusterfs"),
	"VolumeSource.persistentVolumeClaim": unsupportedVolume("persistentVolumeClaim"),
	"VolumeSource.rbd":                   unsupportedVolume("rbd"),
	"VolumeSource.flexVolume":            unsupportedVolume("flexVolume"),
	"VolumeSource.cinder":                unsupportedVolume("cinder"),
	"VolumeSource.cephfs":                unsupportedVolume("cephfs"),
	"VolumeSource.flocker":               unsupportedVolume("flocker"),
	"VolumeSource.downwardAPI":           honoured("on a tmpfs of its own, updated in place by an atomic swap"),
	"VolumeSource.fc":                    unsupportedVolume("fc"),
	"VolumeSource.azureFile":             unsupportedVolume("azureFile"),
	"VolumeSource.configMap":             honoured(""),
	"VolumeSource.vsphereVolume":         unsupportedVolume("vsphereVolume"),
	"VolumeSource.quobyte":               unsupportedVolume("quobyte"),
	"VolumeSource.azureDisk":             unsupportedVolume("azureDisk"),
	"VolumeSource.photonPersistentDisk":  unsupportedVolume("photonPersistentDisk"),
	"VolumeSource.projected":             honoured("configMap, secret and downwardAPI sources, on a tmpfs of its own"),
	"VolumeSource.portworxVolume":        unsupportedVolume("portworxVolume"),
	"VolumeSource.scaleIO":               unsupportedVolume("scaleIO"),
	"VolumeSource.storageos":             unsupportedVolume("storageos"),
	"VolumeSource.csi":                   unsupportedVolume("csi"),
	"VolumeSource.ephemeral":             unsupportedVolume("ephemeral"),
	"VolumeSource.image":                 unsupportedVolume("image"),

	"HostPathVolumeSource.path": honoured("resolved and checked again when mounted"),
	"HostPathVolumeSource.type": honoured(""),

	"EmptyDirVolumeSource.medium": rejected("mqlet supports only the default medium (the node's disk) and Memory").
		except(`"" (the node's disk) or "Memory" (a tmpfs)`, stringIn("", "Memory")),
	"EmptyDirVolumeSource.sizeLimit": honoured("on disk: the pod is evicted when the volume's usage exceeds it (Evicted); medium Memory: the size of the tmpfs"),
	"EmptyDirVolumeSource.mode":      rejected("mqlet does not support an emptyDir mode (the directory is always 0777)"),

	"SecretVolumeSource.secretName":  honoured(""),
	"SecretVolumeSource.items":       honoured(""),
	"SecretVolumeSource.defaultMode": honoured("permission bits"),
	"SecretVolumeSource.optional":    honoured(""),
	"SecretVolumeSource.defaultUser": rejected("mqlet does not support defaultUser (files are owned by root)"),

	"ConfigMapVolumeSource.items":       honoured(""),
	"ConfigMapVolumeSource.defaultMode": honoured("permission bits"),
	"ConfigMapVolumeSource.optional":    honoured(""),
	"ConfigMapVolumeSource.defaultUser": rejected("mqlet does not support defaultUser (files are owned by root)"),

	"LocalObjectReference.name": honoured(""),

	"KeyToPath.key":  honoured(""),
	"KeyToPath.path": honoured(""),
	"KeyToPath.mode": honoured("permission bits"),
	"KeyToPath.user": rejected("mqlet does not support a file's user (files are owned by root)"),

	// Containers
	"Container.name":         honoured(""),
	"Container.image":        honoured(""),
	"Container.command":      honoured(""),
	"Container.args":         honoured(""),
	"Container.workingDir":   honoured(""),
	"Container.ports":        honoured(""),
	"Container.envFrom":      honoured(""),
	"Container.env":          honoured(""),
	"Container.resources":    honoured(""),
	"Container.resizePolicy": rejected("mqlet does not support resizePolicy (a change of resources restarts the container)"),
	"Container.restartPolicy": rejected("mqlet supports a container's restartPolicy only as Always on an init container (a sidecar), not restart rules").
		exceptAt("Always on an init container: a sidecar, started in order with the init containers and not waited for (the next waits for its startupProbe), restarted whenever it exits, with the crash-loop backoff, stopped after the app containers in reverse order, not keeping a restartPolicy Never/OnFailure pod from completing", sidecarPolicy),
	"Container.restartPolicyRules":       rejected("mqlet does not support restartPolicyRules"),
	"Container.volumeMounts":             honoured(""),
	"Container.volumeDevices":            rejected("mqlet does not support volumeDevices (raw block volumes)"),
	"Container.livenessProbe":            honoured("a failure kills the container (Unhealthy, Killing); the restart policy decides"),
	"Container.readinessProbe":           honoured("drives ready, ContainersReady and Ready"),
	"Container.startupProbe":             honoured("holds liveness and readiness back; sets started"),
	"Container.lifecycle":                honoured("postStart bounded at 2 min; preStop within the grace period, before SIGTERM"),
	"Container.terminationMessagePath":   honoured("a fresh writable file per attempt mounted there; its last 4096 bytes become state.terminated.message (12 KiB per pod, shared among its containers); absolute, clean, at most 1024 bytes, not beneath /proc or /sys"),
	"Container.terminationMessagePolicy": honoured("FallbackToLogsOnError: an empty file and a failed exit take the last 80 lines (at most 2048 bytes) of the log"),
	"Container.imagePullPolicy":          honoured(""),
	"Container.securityContext":          honoured(""),
	"Container.stdin":                    honoured("passed to the runtime; mqlet offers no attach"),
	"Container.stdinOnce":                honoured("passed to the runtime"),
	"Container.tty":                      honoured("passed to the runtime"),

	"ContainerPort.name":          honoured(""),
	"ContainerPort.hostPort":      honoured("if admission allows it; checked against ports in use"),
	"ContainerPort.containerPort": honoured(""),
	"ContainerPort.protocol":      honoured(""),
	"ContainerPort.hostIP":        honoured(""),

	"EnvFromSource.prefix":        honoured(""),
	"EnvFromSource.configMapRef":  honoured(""),
	"EnvFromSource.secretRef":     honoured(""),
	"ConfigMapEnvSource.optional": honoured(""),
	"SecretEnvSource.optional":    honoured(""),

	"EnvVar.name":                    honoured(""),
	"EnvVar.value":                   honoured("with $(VAR) expansion"),
	"EnvVar.valueFrom":               honoured(""),
	"EnvVarSource.fieldRef":          honoured(""),
	"EnvVarSource.resourceFieldRef":  honoured("limits and requests with divisor; the node's allocatable when unlimited"),
	"EnvVarSource.configMapKeyRef":   honoured(""),
	"EnvVarSource.secretKeyRef":      honoured(""),
	"EnvVarSource.fileKeyRef":        honoured("read from an emptyDir, opened beneath the volume, at most 1 MiB"),
	"FileKeySelector.volumeName":     honoured("an emptyDir volume of the pod"),
	"FileKeySelector.path":           honoured("opened beneath the volume, no symlink followed"),
	"FileKeySelector.key":            honoured(""),
	"FileKeySelector.optional":       honoured(""),
	"ObjectFieldSelector.apiVersion": honoured(""),
	"ObjectFieldSelector.fieldPath": rejected("mqlet does not support this fieldRef (supported: "+strings.Join(supportedFieldRefs, ", ")+", metadata.labels['<key>'], metadata.annotations['<key>'])").
		except(strings.Join(supportedFieldRefs, ", ")+", metadata.labels['<key>'], metadata.annotations['<key>']", fieldRefSupported),
	"ConfigMapKeySelector.key":      honoured(""),
	"ConfigMapKeySelector.optional": honoured(""),
	"SecretKeySelector.key":         honoured(""),
	"SecretKeySelector.optional":    honoured(""),

	"ResourceRequirements.limits": rejected("mqlet enforces only cpu, memory and ephemeral-storage limits").
		except("cpu and memory (CFS quota, memory limit); ephemeral-storage (the pod is evicted past it: writable layer and logs per container, with its emptyDirs for the pod's total)",
			keysIn(string(v1.ResourceCPU), string(v1.ResourceMemory), string(v1.ResourceEphemeralStorage))),
	"ResourceRequirements.requests": rejected("mqlet accounts only cpu, memory and ephemeral-storage requests").
		except("cpu and memory (CPU shares), ephemeral-storage; admission against allocatable: OutOfcpu, OutOfmemory, OutOfephemeral-storage; eviction ranks pods by usage above requests",
			keysIn(string(v1.ResourceCPU), string(v1.ResourceMemory), string(v1.ResourceEphemeralStorage))),
	"ResourceRequirements.claims": rejected("mqlet does not support resource claims (dynamic resource allocation)"),

	"VolumeMount.name":              honoured(""),
	"VolumeMount.readOnly":          honoured(""),
	"VolumeMount.recursiveReadOnly": honoured("Disabled or IfPossible (the runtime cannot do Enabled, which is refused)"),
	"VolumeMount.mountPath":         honoured(""),
	"VolumeMount.subPath":           honoured("resolved beneath the volume, never through a symlink out of it"),
	"VolumeMount.mountPropagation": rejected("mqlet does not support mount propagation (every mount is private)").
		except("None", stringIn(string(v1.MountPropagationNone))),
	"VolumeMount.subPathExpr":      honoured(""),
	"VolumeMount.bindMountOptions": rejected("mqlet does not support bindMountOptions"),

	"SecurityContext.capabilities":             honoured("additions only if admission allows them"),
	"SecurityContext.privileged":               honoured("if admission allows it"),
	"SecurityContext.seLinuxOptions":           honoured("passed to the runtime; refused when the host has no SELinux (no label would apply)"),
	"SecurityContext.windowsOptions":           ignored(windowsOnly),
	"SecurityContext.runAsUser":                honoured(""),
	"SecurityContext.runAsGroup":               honoured(""),
	"SecurityContext.runAsNonRoot":             honoured("checked against the image's user, with the kubelet's messages"),
	"SecurityContext.readOnlyRootFilesystem":   honoured(""),
	"SecurityContext.allowPrivilegeEscalation": honoured(""),
	"SecurityContext.procMount":                honoured("Unmasked only if admission allows it"),
	"SecurityContext.seccompProfile":           honoured("RuntimeDefault (also when unset) or Unconfined; Localhost is refused"),
	"SecurityContext.appArmorProfile":          honoured("passed to the runtime; a profile other than Unconfined is refused when the host has no AppArmor, as the kubelet does"),

	"Capabilities.add":  honoured(""),
	"Capabilities.drop": honoured(""),

	"SeccompProfile.type": honoured(""),

	"AppArmorProfile.type":             honoured(""),
	"AppArmorProfile.localhostProfile": honoured("the runtime loads it; the host must have AppArmor"),

	"SELinuxOptions.user":             honoured(""),
	"SELinuxOptions.role":             honoured(""),
	"SELinuxOptions.type":             honoured(""),
	"SELinuxOptions.level":            honoured(""),
	"SeccompProfile.localhostProfile": rejected("mqlet does not support Localhost seccomp profiles"),

	// Pod security context
	"PodSecurityContext.seLinuxOptions":           honoured("passed to the runtime; refused when the host has no SELinux (no label would apply)"),
	"PodSecurityContext.windowsOptions":           ignored(windowsOnly),
	"PodSecurityContext.runAsUser":                honoured(""),
	"PodSecurityContext.runAsGroup":               honoured(""),
	"PodSecurityContext.runAsNonRoot":             honoured(""),
	"PodSecurityContext.supplementalGroups":       honoured(""),
	"PodSecurityContext.supplementalGroupsPolicy": rejected("mqlet does not support supplementalGroupsPolicy Strict").except("Merge (the runtime's behaviour)", stringIn(string(v1.SupplementalGroupsPolicyMerge))),
	"PodSecurityContext.fsGroup":                  honoured("group ownership and setgid on volumes, added to the containers' groups"),
	"PodSecurityContext.fsGroupChangePolicy":      honoured(""),
	"PodSecurityContext.sysctls":                  honoured("namespaced sysctls of namespaces the pod does not share with the host"),
	"PodSecurityContext.seccompProfile":           honoured(""),
	"PodSecurityContext.appArmorProfile":          honoured("passed to the runtime; a profile other than Unconfined is refused when the host has no AppArmor, as the kubelet does"),
	"PodSecurityContext.seLinuxChangePolicy":      rejected("mqlet does not support seLinuxChangePolicy"),

	"Sysctl.name":  honoured(""),
	"Sysctl.value": honoured(""),

	// Affinity: only what decides whether a pod may run on this node.
	"Affinity.nodeAffinity":    honoured(""),
	"Affinity.podAffinity":     ignored(notScheduled),
	"Affinity.podAntiAffinity": ignored(notScheduled),

	"NodeAffinity.requiredDuringSchedulingIgnoredDuringExecution":  honoured("checked against the node's labels and name at admission (NodeAffinity)"),
	"NodeAffinity.preferredDuringSchedulingIgnoredDuringExecution": ignored("a preference among nodes; the kubelet ignores it"),

	"NodeSelector.nodeSelectorTerms":    honoured(""),
	"NodeSelectorTerm.matchExpressions": honoured(""),
	"NodeSelectorTerm.matchFields":      honoured("metadata.name"),
	"NodeSelectorRequirement.key":       honoured(""),
	"NodeSelectorRequirement.operator":  honoured(""),
	"NodeSelectorRequirement.values":    honoured(""),

	"PodDNSConfig.nameservers": honoured(""),
	"PodDNSConfig.searches":    honoured(""),
	"PodDNSConfig.options":     honoured(""),
	"PodDNSConfigOption.name":  honoured(""),
	"PodDNSConfigOption.value": honoured(""),

	"PodOS.name": honoured(""),

	// Rows below fields rejected today. They take effect when the field
	// above them is honoured (probes, hooks, downward API and /etc/hosts
	// are being built), so that flipping that one row is the whole change
	// to this table and what must stay refused stays refused.
	"Probe.initialDelaySeconds":           honoured(""),
	"Probe.timeoutSeconds":                honoured(""),
	"Probe.periodSeconds":                 honoured(""),
	"Probe.successThreshold":              honoured(""),
	"Probe.failureThreshold":              honoured(""),
	"Probe.terminationGracePeriodSeconds": honoured(""),
	"ProbeHandler.exec":                   honoured(""),
	"ProbeHandler.httpGet":                honoured(""),
	"ProbeHandler.tcpSocket":              honoured(""),
	"ProbeHandler.grpc":                   honoured("the standard gRPC health protocol"),
	"ExecAction.command":                  honoured(""),
	"HTTPGetAction.path":                  honoured(""),
	"HTTPGetAction.port":                  honoured("a number or a container port's name"),
	"HTTPGetAction.host":                  honoured("if admission allows it"),
	"HTTPGetAction.scheme":                honoured(""),
	"HTTPGetAction.httpHeaders":           honoured(""),
	"HTTPGetAction.protocol":              honoured("HTTP2 is cleartext HTTP/2 with prior knowledge (h2c)"),
	"HTTPHeader.name":                     honoured(""),
	"HTTPHeader.value":                    honoured(""),
	"TCPSocketAction.port":                honoured(""),
	"TCPSocketAction.host":                honoured("if admission allows it"),
	"GRPCAction.port":                     honoured(""),
	"GRPCAction.service":                  honoured(""),
	"GRPCAction.mode":                     honoured("TLS does not verify the server's certificate, as in the kubelet"),

	"Lifecycle.postStart":        honoured(""),
	"Lifecycle.preStop":          honoured(""),
	"Lifecycle.stopSignal":       rejected("mqlet does not support stopSignal"),
	"LifecycleHandler.exec":      honoured(""),
	"LifecycleHandler.httpGet":   honoured(""),
	"LifecycleHandler.tcpSocket": rejected("mqlet does not support tcpSocket lifecycle handlers (nor does the kubelet run them)"),
	"LifecycleHandler.sleep":     honoured(""),
	"SleepAction.seconds":        honoured(""),

	"DownwardAPIVolumeSource.items":          honoured(""),
	"DownwardAPIVolumeSource.defaultMode":    honoured("permission bits"),
	"DownwardAPIVolumeSource.defaultUser":    rejected("mqlet does not support defaultUser (files are owned by root)"),
	"DownwardAPIVolumeFile.path":             honoured(""),
	"DownwardAPIVolumeFile.fieldRef":         honoured(""),
	"DownwardAPIVolumeFile.resourceFieldRef": honoured(""),
	"DownwardAPIVolumeFile.mode":             honoured("permission bits"),
	"DownwardAPIVolumeFile.user":             rejected("mqlet does not support a file's user (files are owned by root)"),
	"ResourceFieldSelector.containerName":    honoured(""),
	"ResourceFieldSelector.resource":         honoured(""),
	"ResourceFieldSelector.divisor":          honoured(""),

	"ProjectedVolumeSource.sources":        honoured(""),
	"ProjectedVolumeSource.defaultMode":    honoured("permission bits"),
	"ProjectedVolumeSource.defaultUser":    rejected("mqlet does not support defaultUser (files are owned by root)"),
	"VolumeProjection.secret":              honoured(""),
	"VolumeProjection.downwardAPI":         honoured(""),
	"VolumeProjection.configMap":           honoured(""),
	"VolumeProjection.serviceAccountToken": rejected("mqlet does not support serviceAccountToken projections (" + noAPIServer + " to issue tokens)"),
	"VolumeProjection.clusterTrustBundle":  rejected("mqlet does not support clusterTrustBundle projections (" + noAPIServer + " to hold ClusterTrustBundles)"),
	"VolumeProjection.podCertificate":      rejected("mqlet does not support podCertificate projections (" + noAPIServer + " to issue certificates)"),
	"SecretProjection.items":               honoured(""),
	"SecretProjection.optional":            honoured(""),
	"ConfigMapProjection.items":            honoured(""),
	"ConfigMapProjection.optional":         honoured(""),
	"DownwardAPIProjection.items":          honoured(""),

	"HostAlias.ip":        honoured(""),
	"HostAlias.hostnames": honoured(""),
}

// CheckSupport refuses, each with its path, every field of the pod's spec
// that the support table rejects and that is set to a value mqlet does not
// honour, e.g. `spec.volumes[0].nfs: Forbidden: mqlet does not support nfs volumes`.
// A field with no row (a Kubernetes upgrade added it) is refused too.
func CheckSupport(pod *v1.Pod) field.ErrorList { return supportTable.check(pod) }

// supportRules is a support table, keyed "<Go type>.<json name>".
type supportRules map[string]rule

func (rules supportRules) check(pod *v1.Pod) field.ErrorList {
	var errs field.ErrorList
	rules.walk(field.NewPath("spec"), reflect.ValueOf(&pod.Spec).Elem(), &errs)
	return errs
}

const corePkg = "k8s.io/api/core/v1"

func (rules supportRules) walk(p *field.Path, v reflect.Value, errs *field.ErrorList) {
	switch v.Kind() {
	case reflect.Pointer:
		if !v.IsNil() {
			rules.walk(p, v.Elem(), errs)
		}
	case reflect.Slice:
		for i := 0; i < v.Len(); i++ {
			rules.walk(p.Index(i), v.Index(i), errs)
		}
	case reflect.Map:
		keys := v.MapKeys()
		slices.SortFunc(keys, func(a, b reflect.Value) int { return strings.Compare(a.String(), b.String()) })
		for _, k := range keys {
			rules.walk(p.Key(k.String()), v.MapIndex(k), errs)
		}
	case reflect.Struct:
		if v.Type().PkgPath() == corePkg {
			rules.walkFields(p, v, errs)
		}
	}
}

func (rules supportRules) walkFields(p *field.Path, v reflect.Value, errs *field.ErrorList) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		f, fv := t.Field(i), v.Field(i)
		if !f.IsExported() {
			continue
		}
		if f.Anonymous { // inlined in JSON: its fields are the parent's
			rules.walk(p, fv, errs)
			continue
		}
		if unset(fv) {
			continue
		}
		name := jsonName(f)
		r, ok := rules[t.Name()+"."+name]
		fp := p.Child(name)
		switch {
		case !ok:
			*errs = append(*errs, field.Forbidden(fp, "mqlet does not support this field (it has no entry in mqlet's support table)"))
		case r.support == Rejected && r.allowed == nil && r.allowedAt == nil:
			*errs = append(*errs, field.Forbidden(fp, r.why))
		case r.support == Rejected && r.allowedAt != nil && !r.allowedAt(fp.String(), reflect.Indirect(fv)),
			r.support == Rejected && r.allowed != nil && !r.allowed(reflect.Indirect(fv)):
			detail := r.why
			if v := reflect.Indirect(fv); v.Kind() == reflect.String {
				detail += fmt.Sprintf(": %q", v.String()) // a value of the API's own choices or a path, never a secret
			}
			*errs = append(*errs, field.Forbidden(fp, detail))
		case r.support == Honoured:
			rules.walk(fp, fv, errs)
		}
	}
}

// unset is a field the pod does not set: zero, or an empty list or map.
func unset(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Slice, reflect.Map:
		return v.Len() == 0
	}
	return v.IsZero()
}

func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	if name == "" {
		return f.Name
	}
	return name
}
