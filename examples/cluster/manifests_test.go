package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/json"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// deployDir is the repository's deploy/ directory.
const deployDir = "../../deploy"

// manifest is one object of a file of deploy/kubernetes.
type manifest struct {
	file string
	obj  runtime.Object
}

// k8sScheme knows the kinds deploy/kubernetes may hold.
func k8sScheme(t *testing.T) *runtime.Scheme {
	t.Helper()
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{corev1.AddToScheme, appsv1.AddToScheme, policyv1.AddToScheme, batchv1.AddToScheme} {
		if err := add(s); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

// decodeManifests decodes every document of data strictly: a kind the
// scheme does not know, an unknown or duplicated field, a value of the
// wrong type is an error.
func decodeManifests(s *runtime.Scheme, data []byte) ([]runtime.Object, error) {
	codec := json.NewSerializerWithOptions(json.DefaultMetaFactory, s, s, json.SerializerOptions{Yaml: true, Strict: true})
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var out []runtime.Object
	for i := 0; ; i++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(stripComments(doc))) == 0 {
			continue
		}
		obj, gvk, err := codec.Decode(doc, nil, nil)
		if err != nil {
			return nil, fmt.Errorf("document %d (%v): %w", i, gvk, err)
		}
		out = append(out, obj)
	}
}

// stripComments drops YAML comment lines.
func stripComments(doc []byte) []byte {
	var b bytes.Buffer
	for line := range bytes.Lines(doc) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			b.Write(line)
		}
	}
	return b.Bytes()
}

// loadManifests decodes every file of deploy/kubernetes strictly.
func loadManifests(t *testing.T) []manifest {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(deployDir, "kubernetes", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s/kubernetes (%v)", deployDir, err)
	}
	s := k8sScheme(t)
	var out []manifest
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := decodeManifests(s, data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, o := range objs {
			out = append(out, manifest{file: filepath.Base(f), obj: o})
		}
	}
	return out
}

// TestStrictDecodingRefusesUnknownFields: the decoder the manifest tests
// use refuses a misspelt field, a duplicated one and an unknown kind, so a
// manifest that decodes is one the API server would take as written.
func TestStrictDecodingRefusesUnknownFields(t *testing.T) {
	s := k8sScheme(t)
	good := "apiVersion: v1\nkind: Service\nmetadata:\n  name: a\nspec:\n  clusterIP: None\n"
	if _, err := decodeManifests(s, []byte(good)); err != nil {
		t.Fatalf("a valid Service: %v", err)
	}
	for name, doc := range map[string]string{
		"misspelt field":   "apiVersion: v1\nkind: Service\nmetadata:\n  name: a\nspec:\n  clusterIp: None\n",
		"duplicated field": "apiVersion: v1\nkind: Service\nmetadata:\n  name: a\n  name: b\n",
		"unknown kind":     "apiVersion: v1\nkind: Servise\nmetadata:\n  name: a\n",
		"wrong type":       "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: a\nspec:\n  replicas: three\n",
		"second document":  good + "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: b\nspec:\n  publishNotReady: true\n",
	} {
		if _, err := decodeManifests(s, []byte(doc)); err == nil {
			t.Errorf("%s: decoded without an error", name)
		}
	}
}

var envRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expandArgs expands $(VAR) references of a container's args as the
// kubelet does, with the values of env (a reference to a variable not in
// env stays as written).
func expandArgs(args []string, env map[string]string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = envRef.ReplaceAllStringFunc(a, func(ref string) string {
			if v, ok := env[ref[2:len(ref)-1]]; ok {
				return v
			}
			return ref
		})
	}
	return out
}

// podEnv is the environment of container c in pod podName of namespace
// ns: its literal values and the downward API fields it names.
func podEnv(t *testing.T, c corev1.Container, podName, ns string) map[string]string {
	t.Helper()
	env := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = e.Value
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.name":
			env[e.Name] = podName
		case e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace":
			env[e.Name] = ns
		case e.ValueFrom.SecretKeyRef != nil:
			env[e.Name] = "secret"
		default:
			t.Errorf("container %s: env %s from %+v: not understood by this test", c.Name, e.Name, e.ValueFrom)
		}
	}
	return env
}

// selects reports whether selector selects a pod labelled labels.
func selects(selector, labels map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

// portNumber resolves a probe's or Service's port against container c:
// a number, or the name of one of its ports.
func portNumber(c corev1.Container, name string, number int32) (int32, bool) {
	if name == "" {
		return number, number != 0
	}
	i := slices.IndexFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == name })
	if i < 0 {
		return 0, false
	}
	return c.Ports[i].ContainerPort, true
}

// hostPort splits a -flag's host:port, failing the test if it is not one.
func hostPort(t *testing.T, flag, addr string) (host, port string) {
	t.Helper()
	i := strings.LastIndexByte(addr, ':')
	if i < 0 {
		t.Fatalf("%s %q: not host:port", flag, addr)
	}
	return addr[:i], addr[i+1:]
}

// podTemplateOfJob returns the pod spec of a Job manifest.
func podTemplateOfJob(m manifest) (corev1.PodSpec, bool) {
	j, ok := m.obj.(*batchv1.Job)
	if !ok {
		return corev1.PodSpec{}, false
	}
	return j.Spec.Template.Spec, true
}
