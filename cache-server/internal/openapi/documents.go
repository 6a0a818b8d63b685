package openapi

import (
	"encoding/json"
	"fmt"
	"net/url"
	"path"
	"regexp"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/kube-openapi/pkg/handler3"
)

// document is one OpenAPI document in both encodings the apiserver serves.
type document struct {
	json, proto []byte
	// etag is the apiserver's ETag of both encodings: the SHA-512 of json,
	// which is also the ?hash= of a v3 group-version URL.
	etag     string
	modified time.Time // Last-Modified
}

// snapshot is everything served at one time. A refresh builds a new one
// and swaps it in whole, so a reader never sees a discovery document and
// group-version documents from different refreshes.
type snapshot struct {
	// The cached resources' face (kubectl through the prefix, or direct):
	// the upstream's documents byte for byte, v3 narrowed to the paths the
	// tier serves (see servedPaths).
	v2          document
	v3          map[string]document // by v3 discovery path, e.g. "api/v1"
	v3Discovery []byte
	// The aggregator's face: the profile's own API group (groupDocuments).
	groupPath        string // "apis/<group>/<version>"
	groupV2, groupV3 document
	groupV3Discovery []byte
}

// servedPaths are the v3 discovery paths of the endpoints the tier itself
// serves for gvs: the discovery roots (/api, /apis, /apis/<group>) and the
// group-versions. The apiserver lists many more (other groups, /version,
// OIDC); kubectl would find no resources there in the tier's discovery.
func servedPaths(gvs []schema.GroupVersion) map[string]bool {
	out := map[string]bool{"apis": true}
	for _, gv := range gvs {
		if gv.Group == "" {
			out["api"] = true
			out["api/"+gv.Version] = true
			continue
		}
		out["apis/"+gv.Group] = true
		out["apis/"+gv.Group+"/"+gv.Version] = true
	}
	return out
}

// relativeURL is where a v3 document is served, as the apiserver writes it
// (kube-openapi's constructServerRelativeURL).
func relativeURL(discoveryPath, hash string) string {
	u := url.URL{Path: path.Join("/openapi/v3", discoveryPath)}
	q := url.Values{}
	q.Set("hash", hash)
	u.RawQuery = q.Encode()
	return u.String()
}

// discoveryJSON is the v3 discovery document listing docs.
func discoveryJSON(docs map[string]document) ([]byte, error) {
	d := handler3.OpenAPIV3Discovery{Paths: map[string]handler3.OpenAPIV3DiscoveryGroupVersion{}}
	for p, doc := range docs {
		d.Paths[p] = handler3.OpenAPIV3DiscoveryGroupVersion{ServerRelativeURL: relativeURL(p, doc.etag)}
	}
	return json.Marshal(d)
}

// parseDiscovery reads the upstream's v3 discovery and keeps the paths in
// served, each with the hash of its current document.
func parseDiscovery(body []byte, served map[string]bool) (map[string]string, error) {
	var d handler3.OpenAPIV3Discovery
	if err := json.Unmarshal(body, &d); err != nil {
		return nil, fmt.Errorf("the v3 discovery document is not JSON: %w", err)
	}
	if d.Paths == nil {
		return nil, fmt.Errorf("the v3 discovery document has no paths")
	}
	out := map[string]string{}
	for p, gv := range d.Paths {
		if !served[p] {
			continue
		}
		u, err := url.Parse(gv.ServerRelativeURL)
		if err != nil || u.Path != path.Join("/openapi/v3", p) || u.Query().Get("hash") == "" {
			return nil, fmt.Errorf("the v3 discovery document lists %q at %q, not /openapi/v3/%s?hash=...", p, gv.ServerRelativeURL, p)
		}
		out[p] = u.Query().Get("hash")
	}
	return out, nil
}

// The schemas every group-version document carries for its resource list.
const (
	resourceListSchema = "io.k8s.apimachinery.pkg.apis.meta.v1.APIResourceList"
	resourceSchema     = "io.k8s.apimachinery.pkg.apis.meta.v1.APIResource"
)

// groupNames are the tag and operationId the apiserver would give the
// resource-list endpoint of group/version (its rule for CRD groups: the
// group's labels in lowerCamelCase).
func groupNames(group, version string) (tag, operationID string) {
	var b strings.Builder
	for i, label := range strings.FieldsFunc(group, func(r rune) bool { return r == '.' || r == '-' }) {
		if i == 0 {
			b.WriteString(label)
			continue
		}
		b.WriteString(strings.ToUpper(label[:1]) + label[1:])
	}
	camel := b.String()
	return camel + "_" + version, "get" + strings.ToUpper(camel[:1]) + camel[1:] + strings.ToUpper(version[:1]) + version[1:] + "APIResources"
}

var refPattern = regexp.MustCompile(`"\$ref":\s*"#/(?:definitions|components/schemas)/([^"]+)"`)

// schemaClosure copies name and every schema it references (transitively)
// out of schemas, verbatim.
func schemaClosure(schemas map[string]json.RawMessage, name string) (map[string]json.RawMessage, error) {
	out := map[string]json.RawMessage{}
	todo := []string{name}
	for len(todo) > 0 {
		n := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if _, done := out[n]; done {
			continue
		}
		s, ok := schemas[n]
		if !ok {
			return nil, fmt.Errorf("the upstream document has no schema %s", n)
		}
		out[n] = s
		for _, m := range refPattern.FindAllSubmatch(s, -1) {
			todo = append(todo, string(m[1]))
		}
	}
	return out, nil
}

// groupDocuments describes the profile's own API group as the aggregator
// fetches it (kube-aggregator's OpenAPI controllers): one group-version
// whose only endpoint is its resource list — true to the group's
// discovery, which lists no resources. The aggregator merges the v2
// document into the cluster's (keeping only paths under
// /apis/<group>/<version>/, renaming any definition that differs from the
// cluster's) and proxies the v3 group-version to the tier; so the schemas
// are copied verbatim from the upstream's own documents — equal to the
// cluster's, nothing is renamed — and nothing outside the group is
// described (a v3 discovery entry such as api/v1 would take the cluster's
// own api/v1 document over).
func groupDocuments(group, version string, upstreamV2, upstreamV3 []byte) (v2, v3 []byte, err error) {
	tag, opID := groupNames(group, version)
	p := "/apis/" + group + "/" + version + "/"
	media := []string{"application/json", "application/yaml", "application/vnd.kubernetes.protobuf"}

	var in2 struct {
		Info                json.RawMessage            `json:"info"`
		Definitions         map[string]json.RawMessage `json:"definitions"`
		SecurityDefinitions json.RawMessage            `json:"securityDefinitions,omitempty"`
		Security            json.RawMessage            `json:"security,omitempty"`
	}
	if err := json.Unmarshal(upstreamV2, &in2); err != nil {
		return nil, nil, fmt.Errorf("the upstream v2 document is not JSON: %w", err)
	}
	defs, err := schemaClosure(in2.Definitions, resourceListSchema)
	if err != nil {
		return nil, nil, fmt.Errorf("v2: %w", err)
	}
	ref2 := map[string]string{"$ref": "#/definitions/" + resourceListSchema}
	doc2 := map[string]any{
		"swagger": "2.0",
		"info":    in2.Info,
		"paths": map[string]any{p: map[string]any{"get": map[string]any{
			"description": "get available resources", "consumes": media, "produces": media, "schemes": []string{"https"},
			"tags": []string{tag}, "operationId": opID,
			"responses": map[string]any{
				"200": map[string]any{"description": "OK", "schema": ref2},
				"401": map[string]any{"description": "Unauthorized"},
			},
		}}},
		"definitions": defs,
	}
	if len(in2.SecurityDefinitions) > 0 {
		doc2["securityDefinitions"] = in2.SecurityDefinitions
	}
	if len(in2.Security) > 0 {
		doc2["security"] = in2.Security
	}
	if v2, err = json.Marshal(doc2); err != nil {
		return nil, nil, err
	}

	var in3 struct {
		Info       json.RawMessage `json:"info"`
		Components struct {
			Schemas         map[string]json.RawMessage `json:"schemas"`
			SecuritySchemes json.RawMessage            `json:"securitySchemes,omitempty"`
		} `json:"components"`
	}
	if err := json.Unmarshal(upstreamV3, &in3); err != nil {
		return nil, nil, fmt.Errorf("the upstream v3 document is not JSON: %w", err)
	}
	schemas, err := schemaClosure(in3.Components.Schemas, resourceListSchema)
	if err != nil {
		return nil, nil, fmt.Errorf("v3: %w", err)
	}
	content := map[string]any{}
	for _, m := range media {
		content[m] = map[string]any{"schema": map[string]string{"$ref": "#/components/schemas/" + resourceListSchema}}
	}
	components := map[string]any{"schemas": schemas}
	if len(in3.Components.SecuritySchemes) > 0 {
		components["securitySchemes"] = in3.Components.SecuritySchemes
	}
	v3, err = json.Marshal(map[string]any{
		"openapi": "3.0.0",
		"info":    in3.Info,
		"paths": map[string]any{p: map[string]any{"get": map[string]any{
			"tags": []string{tag}, "description": "get available resources", "operationId": opID,
			"responses": map[string]any{
				"200": map[string]any{"description": "OK", "content": content},
				"401": map[string]any{"description": "Unauthorized"},
			},
		}}},
		"components": components,
	})
	return v2, v3, err
}
