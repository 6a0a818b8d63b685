package metrics

// FlowControl are the families of k8s.io/apiserver's priority and
// fairness (pkg/util/flowcontrol/metrics) the tier serves on /metrics
// where it runs priority and fairness (package apf), with their labels.
// They keep kube-apiserver's names, so its dashboards and queries apply;
// they are listed here, next to the tier's own metrics, so that the
// dashboard test checks panels reading them as it checks the tier's.
//
// These tell an operator what priority and fairness does: requests
// rejected (429), dispatched, queued, waiting and executing per priority
// level and flow schema, each level's seats, and the seats requests were
// charged (the tier's work estimate).
var FlowControl = map[string][]string{
	"apiserver_flowcontrol_rejected_requests_total":       {"priority_level", "flow_schema", "reason"},
	"apiserver_flowcontrol_dispatched_requests_total":     {"priority_level", "flow_schema"},
	"apiserver_flowcontrol_current_inqueue_requests":      {"priority_level", "flow_schema"},
	"apiserver_flowcontrol_current_inqueue_seats":         {"priority_level", "flow_schema"},
	"apiserver_flowcontrol_current_executing_requests":    {"priority_level", "flow_schema"},
	"apiserver_flowcontrol_current_executing_seats":       {"priority_level", "flow_schema"},
	"apiserver_flowcontrol_request_wait_duration_seconds": {"priority_level", "flow_schema", "execute"},
	"apiserver_flowcontrol_request_execution_seconds":     {"priority_level", "flow_schema", "type"},
	"apiserver_flowcontrol_nominal_limit_seats":           {"priority_level"},
	"apiserver_flowcontrol_current_limit_seats":           {"priority_level"},
	"apiserver_flowcontrol_work_estimated_seats":          {"priority_level", "flow_schema"},
}
