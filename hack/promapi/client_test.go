package promapi

import (
	"math"
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestQueryDecoding: the API's answers as Prometheus writes them: values
// are strings ("NaN" and "+Inf" included), a scalar answers as one sample,
// an error envelope becomes the error.
func TestQueryDecoding(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("query") {
		case "v":
			w.Write([]byte(`{"status":"success","data":{"resultType":"vector","result":[{"metric":{"job":"a"},"value":[1.5,"NaN"]},{"metric":{"job":"b"},"value":[1.5,"+Inf"]},{"metric":{},"value":[1.5,"2.5"]}]}}`))
		case "s":
			w.Write([]byte(`{"status":"success","data":{"resultType":"scalar","result":[1.5,"3"]}}`))
		default:
			w.WriteHeader(http.StatusBadRequest)
			w.Write([]byte(`{"status":"error","errorType":"bad_data","error":"parse error"}`))
		}
	}))
	defer srv.Close()
	c := New(srv.URL)
	v, err := c.Query(t.Context(), "v")
	if err != nil || len(v) != 3 || !math.IsNaN(v[0].Value) || !math.IsInf(v[1].Value, 1) || v[2].Value != 2.5 || v[0].Metric["job"] != "a" {
		t.Errorf("vector: %+v %v", v, err)
	}
	s, err := c.Query(t.Context(), "s")
	if err != nil || len(s) != 1 || s[0].Value != 3 {
		t.Errorf("scalar: %+v %v", s, err)
	}
	if _, err := c.Query(t.Context(), "x"); err == nil || err.Error() != "GET /api/v1/query query=x: bad_data: parse error" {
		t.Errorf("error answer: %v", err)
	}
}
