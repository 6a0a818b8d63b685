package auth

import (
	"testing"

	"k8s.io/client-go/rest"
)

// The reviews' client is not throttled at client-go's default 5 QPS (see
// ClientConfig), and the caller's config is left as it was.
func TestClientConfig(t *testing.T) {
	in := &rest.Config{Host: "https://a:6443", BearerToken: "t"}
	out := ClientConfig(in)
	if out.QPS != 200 || out.Burst != 400 || out.Host != in.Host || out.BearerToken != "t" {
		t.Errorf("%+v", out)
	}
	if in.QPS != 0 || in.Burst != 0 {
		t.Errorf("input changed: %+v", in)
	}
}
