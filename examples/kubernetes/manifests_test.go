package kubernetes_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"

	"github.com/goharvest/goharvest/internal/app/reaper"
)

// manifests are the example's objects, by name.
type manifests struct {
	deployments map[string]*appsv1.Deployment
	configMaps  map[string]*corev1.ConfigMap
	secrets     map[string]*corev1.Secret
	rules       map[string]*prometheusRule
}

func newManifests() manifests {
	return manifests{map[string]*appsv1.Deployment{}, map[string]*corev1.ConfigMap{}, map[string]*corev1.Secret{},
		map[string]*prometheusRule{}}
}

// load decodes every document of every .yaml file in the directory strictly, as the API server
// does with fieldValidation=Strict: an unknown or duplicate field, a field name in the wrong
// case, a value of the wrong type, or a kind the example should not hold is an error.
func load(t *testing.T) manifests {
	t.Helper()
	m := newManifests()
	files, _ := filepath.Glob("*.yaml")
	if len(files) == 0 {
		t.Fatal("no manifests")
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		docs := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
		for {
			doc, err := docs.Read()
			if err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			if err := m.add(doc); err != nil {
				t.Errorf("%s: %v", file, err)
			}
		}
	}
	return m
}

func (m manifests) add(doc []byte) error {
	var head struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}
	if err := yaml.Unmarshal(doc, &head); err != nil {
		return err
	}
	if head == (struct {
		APIVersion string `json:"apiVersion"`
		Kind       string `json:"kind"`
	}{}) && len(bytes.TrimSpace(stripComments(doc))) == 0 {
		return nil // a document of comments only
	}
	switch head.APIVersion + " " + head.Kind {
	case "apps/v1 Deployment":
		var d appsv1.Deployment
		if err := decodeStrict(doc, &d); err != nil {
			return fmt.Errorf("Deployment: %w", err)
		}
		m.deployments[d.Name] = &d
	case "v1 ConfigMap":
		var c corev1.ConfigMap
		if err := decodeStrict(doc, &c); err != nil {
			return fmt.Errorf("ConfigMap: %w", err)
		}
		m.configMaps[c.Name] = &c
	case "v1 Secret":
		var s corev1.Secret
		if err := decodeStrict(doc, &s); err != nil {
			return fmt.Errorf("Secret: %w", err)
		}
		m.secrets[s.Name] = &s
	case "monitoring.coreos.com/v1 PrometheusRule":
		var r prometheusRule
		if err := decodeStrict(doc, &r); err != nil {
			return fmt.Errorf("PrometheusRule: %w", err)
		}
		m.rules[r.Name] = &r
	default:
		return fmt.Errorf("unexpected object %q %q", head.APIVersion, head.Kind)
	}
	return nil
}

// decodeStrict decodes a YAML document into an API object the way the API server decodes JSON:
// field names are matched case-sensitively (encoding/json alone would take readonly for
// readOnly), and unknown or duplicate fields are errors.
func decodeStrict(doc []byte, obj any) error {
	data, err := yaml.YAMLToJSONStrict(doc)
	if err != nil {
		return err
	}
	strictErrs, err := kjson.UnmarshalStrict(data, obj, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
	return errors.Join(append(strictErrs, err)...)
}

func stripComments(doc []byte) []byte {
	var out bytes.Buffer
	for line := range bytes.Lines(doc) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out.Write(line)
		}
	}
	return out.Bytes()
}

func TestStrictDecodingRefusesUnknownFields(t *testing.T) {
	m := newManifests()
	for _, doc := range []string{
		"apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nspec:\n  groups:\n    - name: g\n      rules:\n        - alrt: A\n          expr: up\n",
		"apiVersion: apps/v1\nkind: Deployment\nspec:\n  replica: 2\n",
		"apiVersion: v1\nkind: ConfigMap\ndata:\n  a: b\ndata:\n  c: d\n",
		"apiVersion: v1\nkind: Service\n",
		"apiVersion: apps/v1\nkind: Deployment\nspec:\n  Replicas: 2\n",
		"apiVersion: apps/v1\nkind: Deployment\nspec:\n  replicas: two\n",
	} {
		if err := m.add([]byte(doc)); err == nil {
			t.Errorf("accepted:\n%s", doc)
		}
	}
}

func TestManifestsDecode(t *testing.T) {
	m := load(t)
	if len(m.deployments) != 1 || len(m.configMaps) != 1 || len(m.secrets) != 1 || len(m.rules) != 1 {
		t.Fatalf("want one Deployment, ConfigMap, Secret and PrometheusRule; have %d, %d, %d, %d",
			len(m.deployments), len(m.configMaps), len(m.secrets), len(m.rules))
	}
}

// TestReaperSidecar checks the Deployment's reaper against the reaper itself: its configuration
// loads (every ${NAME} it uses is set), the admin address, container port, probes and scrape
// annotations agree, and the pod waits long enough on termination for a clean handover.
func TestReaperSidecar(t *testing.T) {
	m := load(t)
	image := readContainerfile(t)
	for _, d := range m.deployments {
		t.Run(d.Name, func(t *testing.T) {
			pod := d.Spec.Template.Spec
			if d.Spec.Replicas == nil || *d.Spec.Replicas < 2 {
				t.Errorf("replicas %s: want two or more, so that a standby can take over", show(d.Spec.Replicas))
			}
			c := container(t, pod, "reaper")
			if len(c.Command) != 0 {
				t.Errorf("command %q overrides the image's entrypoint, /reaper", c.Command)
			}

			file := reaperConfig(t, m, image, pod, c)
			h := file.Harvest.WithDefaults()
			if err := h.Validate(); err != nil {
				t.Errorf("the reaper's configuration is invalid: %v", err)
			}

			// The admin endpoints, where the kubelet and Prometheus reach them.
			host, port, err := net.SplitHostPort(file.Admin.Address)
			if err != nil {
				t.Fatalf("admin.address %q: %v (the probes need the admin endpoints)", file.Admin.Address, err)
			}
			if host != "" && host != "0.0.0.0" && host != "::" {
				t.Errorf("admin.address %q listens on %s only; the kubelet probes the pod's IP", file.Admin.Address, host)
			}
			adminPort, _ := strconv.Atoi(port)
			if !hasPort(c, adminPort) {
				t.Errorf("the reaper container does not declare port %d, admin.address's", adminPort)
			}
			checkProbe(t, c, "liveness", c.LivenessProbe, reaper.HealthzPath, adminPort)
			checkProbe(t, c, "readiness", c.ReadinessProbe, reaper.ReadyzPath, adminPort)
			if p := c.ReadinessProbe; p != nil && time.Duration(p.TimeoutSeconds)*time.Second <= reaper.ReadyzTimeout {
				t.Errorf("readiness timeoutSeconds %d: /readyz may take up to %v to answer", p.TimeoutSeconds, reaper.ReadyzTimeout)
			}
			annotations := d.Spec.Template.Annotations
			for key, want := range map[string]string{
				"prometheus.io/scrape": "true",
				"prometheus.io/port":   port,
				"prometheus.io/path":   reaper.MetricsPath,
			} {
				if got := annotations[key]; got != want {
					t.Errorf("pod annotation %s = %q, want %q", key, got, want)
				}
			}

			// A clean stop: the epoch's in-flight records (up to maxPollInterval), then leaving
			// the election (up to two heartbeat timeouts).
			handover := h.Limits.MaxPollInterval + 2*h.Limits.HeartbeatTimeout
			if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= handover {
				t.Errorf("terminationGracePeriodSeconds %s: the reaper may need %v to hand over cleanly", show(g), handover)
			}

			if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
				t.Errorf("the reaper's resources lack a CPU or memory request or a memory limit: %v", c.Resources)
			}
			if pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
				t.Error("the pod does not require runAsNonRoot")
			}
			if sc := c.SecurityContext; sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != image.uid {
				t.Errorf("the reaper's runAsUser is not the image's user, %d", image.uid)
			}
		})
	}
}

// imageDefaults is what the Containerfile sets that the manifest must agree with.
type imageDefaults struct {
	uid int64
	cmd []string
}

func readContainerfile(t *testing.T) imageDefaults {
	data, err := os.ReadFile(filepath.Join("..", "..", "Containerfile"))
	if err != nil {
		t.Fatal(err)
	}
	var image imageDefaults
	for line := range strings.Lines(string(data)) {
		if user, ok := strings.CutPrefix(line, "USER "); ok {
			uid, _, _ := strings.Cut(strings.TrimSpace(user), ":")
			if image.uid, err = strconv.ParseInt(uid, 10, 64); err != nil {
				t.Fatalf("Containerfile: USER %q is not numeric", user)
			}
		}
		if cmd, ok := strings.CutPrefix(line, "CMD "); ok {
			if err := json.Unmarshal([]byte(cmd), &image.cmd); err != nil {
				t.Fatalf("Containerfile: CMD %q: %v", cmd, err)
			}
		}
	}
	if image.uid == 0 || len(image.cmd) == 0 {
		t.Fatal("Containerfile: no USER or CMD")
	}
	return image
}

func container(t *testing.T, pod corev1.PodSpec, name string) *corev1.Container {
	for i := range pod.Containers {
		if pod.Containers[i].Name == name {
			return &pod.Containers[i]
		}
	}
	t.Fatalf("no container %q", name)
	return nil
}

func flagValue(t *testing.T, args []string, flag string) string {
	for i, arg := range args {
		if arg == flag && i+1 < len(args) {
			return args[i+1]
		}
	}
	t.Fatalf("arguments %q lack %s", args, flag)
	return ""
}

// reaperConfig returns the configuration the reaper container c reads: the file its arguments
// (or the image's default command) name, from the ConfigMap mounted there, loaded by the
// reaper's own loader with the container's environment.
func reaperConfig(t *testing.T, m manifests, image imageDefaults, pod corev1.PodSpec, c *corev1.Container) reaper.File {
	t.Helper()
	args := c.Args
	if len(args) == 0 {
		args = image.cmd
	}
	configPath := flagValue(t, args, "-f")
	cm := mountedConfigMap(t, m, pod, c, filepath.Dir(configPath))
	data, ok := cm.Data[filepath.Base(configPath)]
	if !ok {
		t.Fatalf("ConfigMap %s has no %s, which the reaper reads", cm.Name, filepath.Base(configPath))
	}
	env := containerEnv(t, m, c)
	file, err := reaper.Load([]byte(data), func(name string) (string, bool) {
		value, ok := env[name]
		return value, ok
	})
	if err != nil {
		t.Fatalf("the reaper cannot load ConfigMap %s's %s with the container's environment: %v", cm.Name, filepath.Base(configPath), err)
	}
	return file
}

// mountedConfigMap returns the ConfigMap mounted whole at dir in c.
func mountedConfigMap(t *testing.T, m manifests, pod corev1.PodSpec, c *corev1.Container, dir string) *corev1.ConfigMap {
	for _, mount := range c.VolumeMounts {
		if filepath.Clean(mount.MountPath) != dir || mount.SubPath != "" {
			continue
		}
		for _, v := range pod.Volumes {
			if v.Name == mount.Name && v.ConfigMap != nil && len(v.ConfigMap.Items) == 0 {
				if cm := m.configMaps[v.ConfigMap.Name]; cm != nil {
					return cm
				}
				t.Fatalf("volume %s names ConfigMap %s, which the example lacks", v.Name, v.ConfigMap.Name)
			}
		}
	}
	t.Fatalf("no ConfigMap is mounted at %s, where the reaper reads its configuration", dir)
	return nil
}

// containerEnv returns c's environment as the kubelet would set it from the example's objects,
// checking that every Secret or ConfigMap it takes a value from is there, with that key.
func containerEnv(t *testing.T, m manifests, c *corev1.Container) map[string]string {
	env := map[string]string{}
	for _, e := range c.Env {
		env[e.Name] = e.Value
		if e.ValueFrom == nil {
			continue
		}
		var value string
		var ok bool
		switch ref := e.ValueFrom; {
		case ref.SecretKeyRef != nil:
			if s := m.secrets[ref.SecretKeyRef.Name]; s != nil {
				if value, ok = s.StringData[ref.SecretKeyRef.Key]; !ok {
					var b []byte
					b, ok = s.Data[ref.SecretKeyRef.Key]
					value = string(b)
				}
			}
		case ref.ConfigMapKeyRef != nil:
			if cm := m.configMaps[ref.ConfigMapKeyRef.Name]; cm != nil {
				value, ok = cm.Data[ref.ConfigMapKeyRef.Key]
			}
		}
		if !ok {
			t.Errorf("env %s: no Secret or ConfigMap of the example has the key it names", e.Name)
		}
		env[e.Name] = value
	}
	return env
}

func hasPort(c *corev1.Container, port int) bool {
	for _, p := range c.Ports {
		if int(p.ContainerPort) == port {
			return true
		}
	}
	return false
}

// checkProbe checks that a probe gets path on port, given by number or by the container's name
// for it.
func checkProbe(t *testing.T, c *corev1.Container, kind string, p *corev1.Probe, path string, port int) {
	t.Helper()
	if p == nil || p.HTTPGet == nil {
		t.Errorf("no HTTP %s probe", kind)
		return
	}
	if p.HTTPGet.Path != path {
		t.Errorf("%s probe path %q, want %q", kind, p.HTTPGet.Path, path)
	}
	if got, err := resolvePort(c, p.HTTPGet.Port); err != nil || got != port {
		t.Errorf("%s probe port %s is %d (%v), want admin.address's %d", kind, p.HTTPGet.Port.String(), got, err, port)
	}
}

func resolvePort(c *corev1.Container, port intstr.IntOrString) (int, error) {
	if port.Type == intstr.Int {
		return port.IntValue(), nil
	}
	for _, p := range c.Ports {
		if p.Name == port.StrVal {
			return int(p.ContainerPort), nil
		}
	}
	return 0, errors.New("no container port of that name")
}

func show[T any](p *T) string {
	if p == nil {
		return "unset"
	}
	return fmt.Sprint(*p)
}
