package kubernetes_test

import (
	"bytes"
	"log/slog"
	"os"
	"reflect"
	"testing"

	"go.yaml.in/yaml/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/goharvest/goharvest/internal/app/reaper"
)

// prometheusRule is the Prometheus Operator's PrometheusRule (monitoring.coreos.com/v1), with
// the fields of a rule the example uses: decoding strictly into it refuses a misspelt one.
type prometheusRule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata"`
	Spec              reaper.RuleGroups `json:"spec"`
}

const prometheusRuleFile = "prometheusrule.yaml"

// The PrometheusRule holds the rules reaper rules makes for the ConfigMap's reaper.yaml, with the
// default sustained time: the same alerts as monitoring/goharvest-rules.yaml, with thresholds
// from this Deployment's settings. GOHARVEST_UPDATE_MONITORING=1 writes it anew.
func TestPrometheusRuleFollowsTheReaperConfig(t *testing.T) {
	m := load(t)
	image := readContainerfile(t)
	if len(m.deployments) != 1 {
		t.Fatalf("%d Deployments; the PrometheusRule follows one", len(m.deployments))
	}
	var want reaper.RuleGroups
	var group string
	for _, d := range m.deployments {
		pod := d.Spec.Template.Spec
		file := reaperConfig(t, m, image, pod, container(t, pod, "reaper"))
		h := file.Harvest
		h.Logger = slog.New(slog.DiscardHandler)
		h = h.WithDefaults()
		want, group = reaper.AlertRules(h.Config, reaper.DefaultSustained), h.LeaderGroupID
	}
	if os.Getenv("GOHARVEST_UPDATE_MONITORING") != "" {
		writePrometheusRule(t, group, want)
		m = load(t)
	}
	if len(m.rules) != 1 {
		t.Fatalf("%d PrometheusRules in the example, want 1", len(m.rules))
	}
	for _, r := range m.rules {
		if !reflect.DeepEqual(r.Spec, want) {
			t.Errorf("PrometheusRule %s is not what reaper rules makes for the ConfigMap's settings; "+
				"run GOHARVEST_UPDATE_MONITORING=1 go test -run TestPrometheusRule . in examples/kubernetes", r.Name)
		}
	}
}

func writePrometheusRule(t *testing.T, group string, rules reaper.RuleGroups) {
	t.Helper()
	var b bytes.Buffer
	b.WriteString(`# goharvest's alerting rules for the reapers of billing-api, for the Prometheus Operator: the
# rules of reaper rules -f reaper.yaml (see docs/monitoring.md), with thresholds derived
# from the ConfigMap's settings. The Prometheus resource's ruleSelector must match its labels.
# Made by examples/kubernetes's test (GOHARVEST_UPDATE_MONITORING=1), which checks it stays so.
`)
	type metadata struct {
		Name   string            `yaml:"name"`
		Labels map[string]string `yaml:"labels"`
	}
	doc := struct {
		APIVersion string            `yaml:"apiVersion"`
		Kind       string            `yaml:"kind"`
		Metadata   metadata          `yaml:"metadata"`
		Spec       reaper.RuleGroups `yaml:"spec"`
	}{"monitoring.coreos.com/v1", "PrometheusRule",
		metadata{group + "-reaper", map[string]string{"app.kubernetes.io/name": group, "app.kubernetes.io/component": "outbox-relay"}},
		rules}
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		t.Fatal(err)
	}
	enc.Close()
	if err := os.WriteFile(prometheusRuleFile, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}
