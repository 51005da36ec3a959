package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// clusterImageCommand is how deploy/'s manifests run this program.
const clusterImageCommand = "/cluster"

// workload is a pod template of deploy/kubernetes that runs this program,
// with the names its pods get.
type workload struct {
	kind, name string
	ns         string
	tmpl       corev1.PodTemplateSpec
	pods       []string // pod names (a StatefulSet's: NAME-0, NAME-1, ...)
	sts        *appsv1.StatefulSet
}

// programContainer returns the container of w that runs this program.
func (w workload) programContainer(t *testing.T) corev1.Container {
	t.Helper()
	for _, c := range w.tmpl.Spec.Containers {
		if slices.Equal(c.Command, []string{clusterImageCommand}) {
			return c
		}
	}
	t.Fatalf("%s %s: no container with command %s", w.kind, w.name, clusterImageCommand)
	return corev1.Container{}
}

// podArgs returns the command line container c gets in pod pod, its
// $(VAR)s expanded, parsed with this program's own flag set.
func (w workload) podArgs(t *testing.T, c corev1.Container, pod string) ([]string, config) {
	t.Helper()
	args := expandArgs(c.Args, podEnv(t, c, pod, w.ns))
	for _, a := range args {
		if envRef.MatchString(a) {
			t.Errorf("%s %s: argument %q refers to a variable the container does not define", w.kind, w.name, a)
		}
	}
	cfg, err := parseFlags(args)
	if err != nil {
		t.Fatalf("%s %s, pod %s: the program refuses its command line %q: %v", w.kind, w.name, pod, args, err)
	}
	return args, cfg
}

// workloads returns the pod templates of the manifests that run this
// program, by role (runner: the StatefulSet, gateway: the Deployment).
func workloads(t *testing.T, ms []manifest) map[string]workload {
	t.Helper()
	out := map[string]workload{}
	add := func(w workload) {
		for _, c := range w.tmpl.Spec.Containers {
			if !slices.Equal(c.Command, []string{clusterImageCommand}) {
				continue
			}
			_, cfg := w.podArgs(t, c, w.pods[0])
			if _, dup := out[cfg.role]; dup {
				t.Fatalf("two workloads run role %s", cfg.role)
			}
			out[cfg.role] = w
		}
	}
	for _, m := range ms {
		switch o := m.obj.(type) {
		case *appsv1.StatefulSet:
			w := workload{kind: "StatefulSet", name: o.Name, ns: o.Namespace, tmpl: o.Spec.Template, sts: o}
			for i := range int(*o.Spec.Replicas) {
				w.pods = append(w.pods, fmt.Sprintf("%s-%d", o.Name, i))
			}
			add(w)
		case *appsv1.Deployment:
			add(workload{kind: "Deployment", name: o.Name, ns: o.Namespace, tmpl: o.Spec.Template, pods: []string{o.Name + "-5d4f8b7c9-x2x7q"}})
		}
	}
	for _, role := range []string{"runner", "gateway"} {
		if _, ok := out[role]; !ok {
			t.Fatalf("no manifest runs the program as a %s", role)
		}
	}
	return out
}

// graceSeconds is the least terminationGracePeriodSeconds or TimeoutStopSec
// for a process with command line cfg after a preStop hook of preStop.
func graceSeconds(cfg config, preStop time.Duration) int64 {
	return int64(math.Ceil((preStop + cfg.graceBound()).Seconds()))
}

// TestKubernetesManifestsRunTheProgramAsDeclared decodes deploy/kubernetes
// strictly and checks what a reviewer would: each container's command line
// is one the program accepts (parsed by its own flag set, as the kubelet
// expands it for each pod); a runner's ID is its pod's name; the probes
// ask the program's health handlers on the port its -debug flag serves;
// the grace period covers the preStop hook, Shutdown's deadline and the
// exit; readiness notices a detach before the lease expires; the rollout
// and the disruption budgets take one runner at a time; the Services and
// budgets select the pods they are for, on ports the pods declare; the
// runners dial etcd.yaml's members; the scrape configuration finds the
// metrics port.
func TestKubernetesManifestsRunTheProgramAsDeclared(t *testing.T) {
	ms := loadManifests(t)
	ws := workloads(t, ms)

	for role, w := range ws {
		c := w.programContainer(t)
		for _, pod := range w.pods {
			_, cfg := w.podArgs(t, c, pod)
			if role == "runner" && cfg.id != pod {
				t.Errorf("pod %s runs runner ID %q, want the pod's name", pod, cfg.id)
			}
			_, debugPort := hostPort(t, "-debug", cfg.debug)
			for _, p := range []struct {
				what  string
				probe *corev1.Probe
				path  string
			}{{"liveness", c.LivenessProbe, LivenessPath}, {"readiness", c.ReadinessProbe, ReadinessPath}} {
				if p.probe == nil || p.probe.HTTPGet == nil {
					t.Errorf("%s: no %s probe over HTTP", w.name, p.what)
					continue
				}
				port, ok := portNumber(c, p.probe.HTTPGet.Port.StrVal, p.probe.HTTPGet.Port.IntVal)
				if p.probe.HTTPGet.Path != p.path || !ok || strconv.Itoa(int(port)) != debugPort {
					t.Errorf("%s: %s probe asks %s on port %v (%d), the program serves it at %s on -debug's port %s",
						w.name, p.what, p.probe.HTTPGet.Path, p.probe.HTTPGet.Port.String(), port, p.path, debugPort)
				}
			}
			// A check waits up to 2 s for the runner's state before it says
			// stuck: the liveness probe must wait longer.
			if lp := c.LivenessProbe; lp != nil && time.Duration(lp.TimeoutSeconds)*time.Second <= 2*time.Second {
				t.Errorf("%s: liveness timeoutSeconds %d, want > 2", w.name, lp.TimeoutSeconds)
			}
			if rp := c.ReadinessProbe; role == "runner" && rp != nil &&
				time.Duration(rp.PeriodSeconds*rp.FailureThreshold)*time.Second >= cfg.ttl {
				t.Errorf("%s: readiness notices a detach after %d x %d s, not within the lease TTL %v", w.name, rp.PeriodSeconds, rp.FailureThreshold, cfg.ttl)
			}
			var preStop time.Duration
			if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
				if c.Lifecycle.PreStop.Sleep == nil {
					t.Errorf("%s: a preStop hook other than sleep: this test cannot bound it", w.name)
				} else {
					preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
				}
			}
			grace := int64(corev1.DefaultTerminationGracePeriodSeconds)
			if g := w.tmpl.Spec.TerminationGracePeriodSeconds; g != nil {
				grace = *g
			}
			if want := graceSeconds(cfg, preStop); grace < want {
				t.Errorf("%s: terminationGracePeriodSeconds %d, want >= %d (preStop %v + Shutdown's deadline %v + exit %v)",
					w.name, grace, want, preStop, cfg.graceBound()-exitMargin, exitMargin)
			}
		}
	}

	// The runners: a StatefulSet behind a headless Service that publishes
	// not-ready pods' names, each runner publishing its own name there.
	rw := ws["runner"]
	rc := rw.programContainer(t)
	sts := rw.sts
	if sts == nil {
		t.Fatalf("the runners run as a %s, want a StatefulSet (stable names: stable runner IDs)", rw.kind)
	}
	if sts.Spec.PodManagementPolicy != appsv1.OrderedReadyPodManagement || sts.Spec.MinReadySeconds <= 0 {
		t.Errorf("runners: podManagementPolicy %q, minReadySeconds %d; want OrderedReady and a positive delay", sts.Spec.PodManagementPolicy, sts.Spec.MinReadySeconds)
	}
	if u := sts.Spec.UpdateStrategy; u.Type != appsv1.RollingUpdateStatefulSetStrategyType ||
		(u.RollingUpdate != nil && u.RollingUpdate.MaxUnavailable != nil && u.RollingUpdate.MaxUnavailable.IntValue() != 1) {
		t.Errorf("runners: update strategy %+v, want a rolling update of one pod at a time", u)
	}
	_, rcfg := rw.podArgs(t, rc, rw.pods[1])
	_, listenPort := hostPort(t, "-listen", rcfg.listen)
	wantAddr := fmt.Sprintf("%s.%s.%s.svc.cluster.local:%s", rw.pods[1], sts.Spec.ServiceName, sts.Namespace, listenPort)
	if rcfg.address != wantAddr {
		t.Errorf("runner %s publishes -address %q, want %q (its name in the headless Service, the -listen port)", rw.pods[1], rcfg.address, wantAddr)
	}
	if rcfg.security.tlsCA == "" {
		t.Errorf("runners listen on %s without transport TLS", rcfg.listen)
	}

	services, budgets := map[string]*corev1.Service{}, 0
	for _, m := range ms {
		switch o := m.obj.(type) {
		case *corev1.Service:
			services[o.Name] = o
			var w *workload
			for _, cand := range ws {
				if selects(o.Spec.Selector, cand.tmpl.Labels) {
					w = &cand
				}
			}
			if w == nil {
				continue // etcd's
			}
			c := w.programContainer(t)
			for _, p := range o.Spec.Ports {
				if _, ok := portNumber(c, p.TargetPort.StrVal, p.TargetPort.IntVal); !ok || p.TargetPort.Type != intstr.String {
					t.Errorf("Service %s: port %s targets %s, not a named port of %s", o.Name, p.Name, p.TargetPort.String(), w.name)
				}
			}
		case *policyv1.PodDisruptionBudget:
			budgets++
			if o.Spec.Selector == nil || o.Spec.Selector.MatchExpressions != nil {
				t.Errorf("PodDisruptionBudget %s: want a matchLabels selector", o.Name)
				continue
			}
			n := 0
			for _, m2 := range ms {
				if w, ok := podTemplate(m2); ok && selects(o.Spec.Selector.MatchLabels, w.Labels) {
					n++
				}
			}
			if n != 1 {
				t.Errorf("PodDisruptionBudget %s selects the pods of %d workloads, want 1", o.Name, n)
			}
		}
	}
	if budgets < 2 {
		t.Errorf("%d PodDisruptionBudgets, want one for runners and one for gateways at least", budgets)
	}
	hs := services[sts.Spec.ServiceName]
	if hs == nil || hs.Spec.ClusterIP != corev1.ClusterIPNone || !hs.Spec.PublishNotReadyAddresses || !selects(hs.Spec.Selector, sts.Spec.Template.Labels) {
		t.Errorf("runners' Service %q = %+v; want headless, publishing not-ready addresses, selecting the runners", sts.Spec.ServiceName, hs)
	}
	gw := ws["gateway"]
	n := 0
	for _, s := range services {
		if selects(s.Spec.Selector, gw.tmpl.Labels) {
			n++
			if selects(s.Spec.Selector, sts.Spec.Template.Labels) {
				t.Errorf("Service %s selects gateways and runners", s.Name)
			}
		}
	}
	if n == 0 {
		t.Error("no Service selects the gateways")
	}

	// The runners dial the members of etcd.yaml, on its client port.
	var etcdSts *appsv1.StatefulSet
	for _, m := range ms {
		if o, ok := m.obj.(*appsv1.StatefulSet); ok && o.Name != sts.Name {
			etcdSts = o
		}
	}
	if etcdSts == nil || *etcdSts.Spec.Replicas != 3 || etcdSts.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		t.Fatalf("etcd: %+v; want a StatefulSet of 3 members started in parallel (a quorum forms only with all)", etcdSts)
	}
	ec := etcdSts.Spec.Template.Spec.Containers[0]
	var want []string
	for i := range 3 {
		want = append(want, fmt.Sprintf("%s-%d.%s.%s.svc.cluster.local:2379", etcdSts.Name, i, etcdSts.Spec.ServiceName, etcdSts.Namespace))
	}
	if got := strings.Split(rcfg.endpoints, ","); !slices.Equal(got, want) {
		t.Errorf("runners' -etcd %v, want etcd.yaml's members %v", got, want)
	}
	eargs := expandArgs(ec.Args, podEnv(t, ec, etcdSts.Name+"-0", etcdSts.Namespace))
	for _, flag := range []string{"--client-cert-auth", "--peer-client-cert-auth", "--initial-cluster=" + strings.Join(func() []string {
		var m []string
		for i := range 3 {
			name := fmt.Sprintf("%s-%d", etcdSts.Name, i)
			m = append(m, fmt.Sprintf("%s=https://%s.%s.%s.svc.cluster.local:2380", name, name, etcdSts.Spec.ServiceName, etcdSts.Namespace))
		}
		return m
	}(), ",")} {
		if !slices.Contains(eargs, flag) {
			t.Errorf("etcd member's args lack %s", flag)
		}
	}
	checkScrapeConfig(t, ws)
}

// podTemplate returns the pod template of a workload manifest.
func podTemplate(m manifest) (corev1.PodTemplateSpec, bool) {
	switch o := m.obj.(type) {
	case *appsv1.StatefulSet:
		return o.Spec.Template, true
	case *appsv1.Deployment:
		return o.Spec.Template, true
	}
	return corev1.PodTemplateSpec{}, false
}

// scrapeConfig is the part of a Prometheus configuration deploy/ uses;
// decoding strictly into it refuses anything else.
type scrapeConfig struct {
	Global struct {
		ScrapeInterval string `json:"scrape_interval"`
	} `json:"global"`
	ScrapeConfigs []struct {
		JobName      string `json:"job_name"`
		MetricsPath  string `json:"metrics_path"`
		KubernetesSD []struct {
			Role       string `json:"role"`
			Namespaces struct {
				Names []string `json:"names"`
			} `json:"namespaces"`
		} `json:"kubernetes_sd_configs"`
		Relabel []struct {
			SourceLabels []string `json:"source_labels"`
			Regex        string   `json:"regex"`
			Action       string   `json:"action"`
			TargetLabel  string   `json:"target_label"`
		} `json:"relabel_configs"`
		Static []struct {
			Targets []string `json:"targets"`
		} `json:"static_configs"`
	} `json:"scrape_configs"`
}

// checkScrapeConfig: deploy/prometheus scrapes MetricsPath; in Kubernetes
// it keeps the pods of both workloads and their container port serving
// -debug, in the workloads' namespace.
func checkScrapeConfig(t *testing.T, ws map[string]workload) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(deployDir, "prometheus", "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var sc scrapeConfig
	if err := yaml.UnmarshalStrict(data, &sc); err != nil {
		t.Fatalf("prometheus.yml: %v", err)
	}
	k8sJobs := 0
	for _, j := range sc.ScrapeConfigs {
		if j.MetricsPath != MetricsPath {
			t.Errorf("prometheus.yml: job %s scrapes %q, the program serves %s", j.JobName, j.MetricsPath, MetricsPath)
		}
		for _, s := range j.Static {
			for _, target := range s.Targets {
				if _, port := hostPort(t, "target", target); port != "8080" {
					t.Errorf("prometheus.yml: target %s, want the units' -debug port 8080", target)
				}
			}
		}
		if len(j.KubernetesSD) == 0 {
			continue
		}
		k8sJobs++
		for role, w := range ws {
			if !slices.Contains(j.KubernetesSD[0].Namespaces.Names, w.ns) {
				t.Errorf("prometheus.yml: job %s does not look in namespace %s", j.JobName, w.ns)
			}
			c := w.programContainer(t)
			_, cfg := w.podArgs(t, c, w.pods[0])
			_, debugPort := hostPort(t, "-debug", cfg.debug)
			kept := false
			for _, p := range c.Ports {
				if strconv.Itoa(int(p.ContainerPort)) != debugPort {
					continue
				}
				meta := map[string]string{"__meta_kubernetes_pod_container_port_name": p.Name}
				for k, v := range w.tmpl.Labels {
					meta["__meta_kubernetes_pod_label_"+strings.NewReplacer(".", "_", "/", "_", "-", "_").Replace(k)] = v
				}
				kept = true
				for _, r := range j.Relabel {
					if r.Action == "keep" && (len(r.SourceLabels) != 1 || meta[r.SourceLabels[0]] != r.Regex) {
						kept = false
					}
				}
			}
			if !kept {
				t.Errorf("prometheus.yml: job %s does not keep the %s pods' -debug port %s", j.JobName, role, debugPort)
			}
		}
	}
	if k8sJobs != 1 {
		t.Errorf("prometheus.yml: %d Kubernetes jobs, want 1", k8sJobs)
	}
}

// unit is a systemd unit file: its settings by key (a key given twice
// keeps both values).
type unit map[string][]string

// parseUnit reads a unit file: sections are ignored, comments dropped,
// continuation lines joined.
func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	u := unit{}
	var cont string
	for line := range strings.Lines(string(data)) {
		line = strings.TrimSpace(line)
		if cont == "" && (line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "[")) {
			continue
		}
		if s, ok := strings.CutSuffix(line, `\`); ok {
			cont += s + " "
			continue
		}
		line, cont = cont+line, ""
		k, v, ok := strings.Cut(line, "=")
		if !ok {
			t.Fatalf("%s: line %q is not KEY=VALUE", path, line)
		}
		u[k] = append(u[k], v)
	}
	return u
}

// one returns the single value of key.
func (u unit) one(t *testing.T, key string) string {
	t.Helper()
	if len(u[key]) != 1 {
		t.Fatalf("%s: %d values, want 1", key, len(u[key]))
	}
	return u[key][0]
}

// TestSystemdUnitsRunTheProgramAsDeclared: each unit of deploy/systemd
// runs a command line the program accepts (its own flag set; %i, %H and
// ${VAR} expanded as systemd would), a runner's ID is the instance name;
// TimeoutStopSec covers Shutdown's deadline and the exit; a crash is
// restarted (the new process waits for its predecessor's lease by itself)
// but the exit status of a conflict — another live process holds the ID,
// or the settings differ from the cluster's — is not.
func TestSystemdUnitsRunTheProgramAsDeclared(t *testing.T) {
	env := map[string]string{"NAMESPACE": "prod", "ETCD_ENDPOINTS": "10.0.0.1:2379,10.0.0.2:2379", "LISTEN_HOST": "10.0.0.5"}
	roles := map[string]bool{}
	for _, f := range []string{"shardhost-runner@.service", "shardhost-gateway.service"} {
		u := parseUnit(t, filepath.Join(deployDir, "systemd", f))
		line := strings.NewReplacer("%i", "runner-7", "%H", "host-1").Replace(u.one(t, "ExecStart"))
		line = os.Expand(line, func(k string) string {
			v, ok := env[k]
			if !ok {
				t.Errorf("%s: ${%s} not in the test's environment file", f, k)
			}
			return v
		})
		words := strings.Fields(line)
		args := words[1:]
		cfg, err := parseFlags(args)
		if err != nil {
			t.Fatalf("%s: the program refuses its command line %q: %v", f, args, err)
		}
		roles[cfg.role] = true
		if cfg.role == "runner" && cfg.id != "runner-7" {
			t.Errorf("%s: instance runner-7 runs runner ID %q, want the instance name", f, cfg.id)
		}
		stop, err := time.ParseDuration(strings.TrimSpace(u.one(t, "TimeoutStopSec")) + "s")
		if err != nil {
			t.Fatalf("%s: TimeoutStopSec: %v", f, err)
		}
		if want := graceSeconds(cfg, 0); int64(stop.Seconds()) < want {
			t.Errorf("%s: TimeoutStopSec %v, want >= %d s (Shutdown's deadline %v + exit %v)", f, stop, want, cfg.graceBound()-exitMargin, exitMargin)
		}
		if got := u.one(t, "Restart"); got != "on-failure" && got != "always" {
			t.Errorf("%s: Restart=%s: a crashed process is not restarted", f, got)
		}
		if ks := u["KillSignal"]; len(ks) > 0 && ks[0] != "SIGTERM" {
			t.Errorf("%s: KillSignal=%s, want SIGTERM (the graceful stop)", f, ks[0])
		}
		if cfg.role == "runner" && !slices.Contains(strings.Fields(u.one(t, "RestartPreventExitStatus")), strconv.Itoa(exitConflict)) {
			t.Errorf("%s: RestartPreventExitStatus does not hold %d: a runner whose ID another live process holds would be restarted in a loop", f, exitConflict)
		}
		if ts := u["TimeoutStartSec"]; len(ts) > 0 {
			t.Errorf("%s: TimeoutStartSec=%s would fight the wait for a predecessor's lease (Run bounds it by StartTimeout)", f, ts[0])
		}
	}
	if !roles["runner"] || !roles["gateway"] {
		t.Errorf("units run roles %v, want runner and gateway", roles)
	}
}
