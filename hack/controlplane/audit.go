package controlplane

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
)

// ReadAudit returns the events of the apiserver's audit log (Options.AuditPolicy)
// whose request arrived at or after since, in the order the apiserver wrote
// them. What a test learns from it is what the apiserver itself saw: who
// sent which request, whatever the client claims.
func (cp *ControlPlane) ReadAudit(since time.Time) ([]auditv1.Event, error) {
	if cp.AuditLog == "" {
		return nil, errors.New("the control plane was started without an audit policy")
	}
	data, err := os.ReadFile(cp.AuditLog)
	if err != nil {
		return nil, err
	}
	// The apiserver may be writing a line right now: only whole lines.
	data = data[:bytes.LastIndexByte(data, '\n')+1]
	var events []auditv1.Event
	for i, line := range bytes.Split(bytes.TrimSuffix(data, []byte("\n")), []byte("\n")) {
		if len(line) == 0 {
			continue
		}
		var ev auditv1.Event
		if err := json.Unmarshal(line, &ev); err != nil {
			return nil, fmt.Errorf("%s line %d: %w", cp.AuditLog, i+1, err)
		}
		if !ev.RequestReceivedTimestamp.Time.Before(since) {
			events = append(events, ev)
		}
	}
	return events, nil
}
