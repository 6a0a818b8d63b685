// Package alerts holds cachetier's Prometheus alerting rules as data: the
// rules for one profile's fleet (the operator renders them into a
// PrometheusRule per profile) and the rules about the operator and every
// profile it manages (shipped in config/prometheus). They are pure functions
// of their scope so that the operator, the shipped manifest and the promtool
// tests all use the same expressions.
package alerts

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"
)

// RunbookBase is where each alert's runbook section lives; an alert's
// runbook_url is RunbookBase + "#" + its lower-cased name.
const RunbookBase = "https://github.com/cachetier/cachetier/blob/main/docs/alerts.md"

// Rule is one alerting rule, in the field order of Prometheus' rule files.
type Rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Group is a named group of rules, evaluated together.
type Group struct {
	Name  string `json:"name"`
	Rules []Rule `json:"rules"`
}

// Alert names. They are the anchors of the runbook sections in
// docs/alerts.md.
const (
	FleetLagging            = "CachetierLaggingBehindAPIServer"
	FreshnessTimeouts       = "CachetierFreshnessTimeouts"
	SlowWatchersTerminated  = "CachetierSlowWatchersTerminated"
	RelistStorm             = "CachetierUpstreamRelistStorm"
	MemoryNearLimit         = "CachetierMemoryNearLimit"
	UpstreamAuthErrors      = "CachetierUpstreamAuthErrors"
	CertificateExpiringSoon = "CachetierCertificateExpiringSoon"
	OpenAPIStale            = "CachetierOpenAPIStale"
	PriorityLevelRejecting  = "CachetierPriorityLevelRejecting"
	FrontShardRangeMissing  = "CachetierFrontShardRangeMissing"
	ShardNoReadyReplica     = "CachetierShardNoReadyReplica"
	ProfileDegraded         = "CachetierProfileDegraded"
	OperatorReconcileErrors = "CachetierOperatorReconcileErrors"
)

// FleetScope selects the series of one fleet: Prometheus Operator names a
// ServiceMonitor's job after the Service, so a profile's fleet is the jobs
// "<profile>-front" and "<profile>-shards" in the operator's namespace.
type FleetScope struct {
	Namespace string
	Profile   string
}

func (s FleetScope) matchers() string {
	return fmt.Sprintf(`namespace=%q,job=~%q`, s.Namespace, regexp.QuoteMeta(s.Profile)+"-(front|shards)")
}

// CertificateWarningDays: the operator renews the 90-day serving
// certificate when 30 days are left, so a certificate served with less
// than 20 days left means renewal or its pickup failed, with weeks to act.
const CertificateWarningDays = 20

// FleetRules are the alerts about one profile's cache-servers.
func FleetRules(s FleetScope) []Group {
	m := s.matchers()
	by := "namespace, job, pod, resource"
	rules := []Rule{
		{
			Alert: FleetLagging,
			// The latest RV is what the apiserver reported at the last RV
			// fetch. A cache whose stream is live reaches it within
			// milliseconds when the resource changes or a consistent read
			// proves progress, but on a quiet resource whose consistent
			// reads do not complete (a sibling shard down fails them
			// before the wait) only the apiserver's next bookmark, about
			// a minute later, carries it: compared with the RV reported
			// two minutes earlier, a live stream is never behind, and a
			// stuck or too slow one stays behind.
			Expr:   fmt.Sprintf(`max by (%s) ((cachetier_upstream_latest_resource_version{%s} offset 2m) - cachetier_upstream_applied_resource_version{%s}) > 0`, by, m, m),
			For:    "5m",
			Labels: map[string]string{"severity": "warning"},
			Annotations: annotations(FleetLagging, "The cache tier is falling behind the apiserver.",
				"{{ $labels.pod }} has not applied {{ $labels.resource }} up to the resourceVersion the apiserver reported two minutes earlier, for 5 minutes ({{ $value }} revisions behind); consistent reads will time out with 504."),
		},
		{
			Alert: FreshnessTimeouts,
			Expr: fmt.Sprintf(`sum by (namespace, job, resource) (rate(cachetier_requests_total{%s,code="504"}[5m]))
  / sum by (namespace, job, resource) (rate(cachetier_requests_total{%s}[5m])) > 0.01`, m, m),
			For:    "5m",
			Labels: map[string]string{"severity": "warning"},
			Annotations: annotations(FreshnessTimeouts, "Consistent reads time out waiting for the cache (504).",
				"{{ $value | humanizePercentage }} of {{ $labels.resource }} requests to {{ $labels.job }} end in 504: the cache did not reach the apiserver's resourceVersion within freshnessTimeout, or could not read it from the apiserver."),
		},
		{
			Alert:  SlowWatchersTerminated,
			Expr:   fmt.Sprintf(`sum by (namespace, job, resource) (increase(cachetier_watchers_terminated_total{%s,reason="slow"}[15m])) > 3`, m),
			Labels: map[string]string{"severity": "warning"},
			Annotations: annotations(SlowWatchersTerminated, "Watchers are being cut because they cannot keep up.",
				"{{ $labels.job }} closed {{ $value | humanize }} {{ $labels.resource }} watches in 15 minutes because the clients did not keep up; they relist from the tier."),
		},
		{
			Alert: RelistStorm,
			// startup relists are expected once per resource and pod.
			Expr:   fmt.Sprintf(`sum by (%s) (increase(cachetier_upstream_relists_total{%s,reason!="startup"}[15m])) > 3`, by, m),
			Labels: map[string]string{"severity": "warning"},
			Annotations: annotations(RelistStorm, "The tier keeps re-reading resources from the apiserver.",
				"{{ $labels.pod }} re-read {{ $labels.resource }} from the apiserver {{ $value | humanize }} times in 15 minutes; every relist is a full LIST on the apiserver."),
		},
		{
			Alert: MemoryNearLimit,
			// Both series come from the same target, so they match on
			// every label.
			Expr:   fmt.Sprintf(`process_resident_memory_bytes{%s} / cachetier_memory_limit_bytes{%s} > 0.9`, m, m),
			For:    "10m",
			Labels: map[string]string{"severity": "warning"},
			Annotations: annotations(MemoryNearLimit, "A cache-server is close to its memory limit.",
				"{{ $labels.pod }} uses {{ $value | humanizePercentage }} of its memory limit; the next growth gets it OOM-killed and it reloads its whole slice."),
		},
		{
			Alert:  UpstreamAuthErrors,
			Expr:   fmt.Sprintf(`sum by (namespace, job, pod, code) (rate(cachetier_upstream_responses_total{%s,code=~"401|403"}[5m])) > 0`, m),
			For:    "5m",
			Labels: map[string]string{"severity": "critical"},
			Annotations: annotations(UpstreamAuthErrors, "The apiserver refuses the tier's requests (401/403).",
				"the apiserver answers {{ $labels.pod }} with {{ $labels.code }}: its credentials or RBAC no longer allow what the tier does (ingest, TokenReview, SubjectAccessReview)."),
		},
		{
			Alert:  CertificateExpiringSoon,
			Expr:   fmt.Sprintf(`min by (namespace, job, pod) (cachetier_serving_certificate_expiry_timestamp_seconds{%s}) - time() < %d * 86400`, m, CertificateWarningDays),
			Labels: map[string]string{"severity": "warning"},
			Annotations: annotations(CertificateExpiringSoon, "A cache-server's serving certificate expires soon.",
				"{{ $labels.pod }} serves a certificate that expires in {{ $value | humanizeDuration }}; the operator should have renewed it 30 days before expiry."),
		},
		{
			Alert: OpenAPIStale,
			// Fronts poll every 10 s; shards never poll (their gauge
			// stays 0, filtered out). 15 minutes without a success is
			// ninety failed polls in a row.
			Expr:   fmt.Sprintf(`time() - max by (namespace, job, pod) (cachetier_openapi_last_success_timestamp_seconds{%s} > 0) > 900`, m),
			Labels: map[string]string{"severity": "warning"},
			Annotations: annotations(OpenAPIStale, "A cache-server cannot refresh the apiserver's OpenAPI documents.",
				"{{ $labels.pod }} has not read the apiserver's OpenAPI documents for {{ $value | humanizeDuration }}; kubectl explain through it misses CRD changes since then."),
		},
		{
			Alert: PriorityLevelRejecting,
			// Priority and fairness answers 429 when a level's queues
			// are full or a request waited 15 s in one. A burst now and
			// then is what it is for; a level rejecting for 5 minutes
			// (a rejection at least every 2) means its clients get less
			// than they ask for, all the time. The counter exists only
			// once a level rejected; rate over 2m needs two scrapes in
			// it (scrape interval 1m or less).
			Expr:   fmt.Sprintf(`sum by (namespace, job, priority_level) (rate(apiserver_flowcontrol_rejected_requests_total{%s}[2m])) > 0`, m),
			For:    "5m",
			Labels: map[string]string{"severity": "warning"},
			Annotations: annotations(PriorityLevelRejecting, "The tier keeps rejecting requests of a priority level with 429.",
				"{{ $labels.job }} has rejected requests at priority level {{ $labels.priority_level }} for 5 minutes ({{ $value | humanize }}/s, 429 with Retry-After): the clients of its flow schemas ask for more than the level's share of the tier's seats."),
		},
		{
			Alert: FrontShardRangeMissing,
			// While the shard count changes, fronts of the old topology
			// find fewer and fewer replicas holding their ranges, until
			// the rollout replaces them (minutes). A front that finds
			// none for 15 minutes answers 503 and is not being replaced:
			// the rollout is stuck. The counter moves on every retry
			// (each read, and the change stream at least every 5 s).
			Expr:   fmt.Sprintf(`sum by (namespace, job, pod, shard) (rate(cachetier_fleet_shard_calls_total{%s,outcome="misdirected"}[5m])) > 0`, m),
			For:    "15m",
			Labels: map[string]string{"severity": "warning"},
			Annotations: annotations(FrontShardRangeMissing, "A front finds no replica of a shard holding the hash shards it expects.",
				"{{ $labels.pod }} has found no replica of {{ $labels.shard }} holding the hash shards its topology gives that shard for 15 minutes: it answers reads with 503 and its watches wait; a change of the shard count is not completing."),
		},
	}
	return []Group{{Name: "cachetier-fleet-" + s.Profile, Rules: rules}}
}

// OperatorRules are the alerts the operator's own metrics raise, for every
// profile it manages: they hold when a fleet cannot be scraped at all (a
// shard whose pods are gone exports nothing).
func OperatorRules() []Group {
	rules := []Rule{
		{
			Alert: ShardNoReadyReplica,
			// Every operator replica exports it from the profile's
			// status: aggregated over them (their pod and instance
			// labels), a leader change does not restart the `for:`.
			Expr:   `max by (namespace, job, profile, shard) (cachetier_profile_shard_ready_replicas) == 0`,
			For:    "2m",
			Labels: map[string]string{"severity": "critical"},
			Annotations: annotations(ShardNoReadyReplica, "A shard has no ready replica.",
				"shard {{ $labels.shard }} of profile {{ $labels.profile }} has no ready replica: reads of its hash shards fail or wait."),
		},
		{
			Alert:  ProfileDegraded,
			Expr:   `max by (namespace, job, profile, type) (cachetier_profile_condition{type="Degraded"}) == 1`,
			For:    "10m",
			Labels: map[string]string{"severity": "warning"},
			Annotations: annotations(ProfileDegraded, "A CacheProfile is Degraded.",
				"profile {{ $labels.profile }} is Degraded; `kubectl describe cacheprofile {{ $labels.profile }}` says which part and why."),
		},
		{
			Alert:  OperatorReconcileErrors,
			Expr:   `sum by (namespace, job, controller) (rate(controller_runtime_reconcile_errors_total{controller="cacheprofile"}[5m])) > 0`,
			For:    "15m",
			Labels: map[string]string{"severity": "warning"},
			Annotations: annotations(OperatorReconcileErrors, "The cachetier operator fails to reconcile.",
				"the cachetier operator keeps failing to reconcile profiles; its log and the profiles' ApplyFailed conditions name the object and the API error."),
		},
	}
	return []Group{{Name: "cachetier-operator", Rules: rules}}
}

func annotations(alert, summary, description string) map[string]string {
	return map[string]string{
		"summary":     summary,
		"description": description,
		"runbook_url": RunbookURL(alert),
	}
}

// RunbookURL is the runbook section of an alert.
func RunbookURL(alert string) string { return RunbookBase + "#" + strings.ToLower(alert) }

// RuleFile renders groups as a Prometheus rule file (what promtool reads).
func RuleFile(groups []Group) ([]byte, error) {
	return yaml.Marshal(map[string]any{"groups": groups})
}

// PrometheusRule renders groups as a Prometheus Operator PrometheusRule
// manifest object (apiVersion monitoring.coreos.com/v1); the operator does
// not depend on the Prometheus Operator's Go module.
func PrometheusRule(name, namespace string, labels map[string]string, groups []Group) (map[string]any, error) {
	b, err := json.Marshal(groups)
	if err != nil {
		return nil, err
	}
	var spec []any
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, err
	}
	meta := map[string]any{"name": name}
	if namespace != "" {
		meta["namespace"] = namespace
	}
	if len(labels) > 0 {
		l := map[string]any{}
		for k, v := range labels {
			l[k] = v
		}
		meta["labels"] = l
	}
	return map[string]any{
		"apiVersion": "monitoring.coreos.com/v1",
		"kind":       "PrometheusRule",
		"metadata":   meta,
		"spec":       map[string]any{"groups": spec},
	}, nil
}
