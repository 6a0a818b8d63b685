package main

import "testing"

func TestSumSeries(t *testing.T) {
	body := `# HELP apiserver_current_inflight_requests x
# TYPE apiserver_current_inflight_requests gauge
apiserver_current_inflight_requests{request_kind="mutating"} 2
apiserver_current_inflight_requests{request_kind="readOnly"} 5
apiserver_current_inflight_requests_other 100
apiserver_flowcontrol_current_executing_seats{flow_schema="exempt",priority_level="exempt"} 1
apiserver_flowcontrol_current_executing_seats{flow_schema="global-default",priority_level="global-default"} 3
apiserver_longrunning_requests{component="apiserver",group="",resource="pods",scope="namespace",subresource="",verb="WATCH"} 4
apiserver_longrunning_requests{component="apiserver",group="x",resource="api",scope="cluster",subresource="",verb="WATCH"} 1
cachetier_watchers 7
`
	for name, want := range map[string]float64{
		"apiserver_current_inflight_requests":                                7,
		`apiserver_current_inflight_requests{request_kind="readOnly"}`:       5,
		"apiserver_flowcontrol_current_executing_seats":                      4,
		`apiserver_longrunning_requests{verb="WATCH",group=""}`:              4,
		`apiserver_longrunning_requests{resource="api"}`:                     1,
		"cachetier_watchers":                                                 7,
		"apiserver_flowcontrol_current_inqueue_requests":                     0,
		`apiserver_current_inflight_requests{request_kind="readOnly",x="y"}`: 0,
	} {
		if got := sumSeries(body, name); got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
}
