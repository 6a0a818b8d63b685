package imagebuild

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// dockerfile is what the tests compare with imagebuild: the build stage's
// ENV and RUN, and the runtime (last) stage's declarations.
type dockerfile struct {
	buildEnv   map[string]string // ENV of the build stage, ${TARGET*} resolved
	buildRuns  []string
	runtimeArg map[string]string // ARG defaults, by name
	runtimeRef string            // the last FROM's image, ARGs resolved
	labels     map[string]string
	user       string
	entrypoint []string
	copies     map[string]string // image path -> build stage path, from COPY --from=build
}

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	keyword, args string
	line          int
}

func splitInstructions(text string) []instruction {
	var out []instruction
	var cur strings.Builder
	start := 0
	for i, line := range strings.Split(text, "\n") {
		trimmed := strings.TrimSpace(line)
		if cur.Len() == 0 && (trimmed == "" || strings.HasPrefix(trimmed, "#")) {
			continue
		}
		if cur.Len() > 0 && strings.HasPrefix(trimmed, "#") {
			continue // a comment inside a continued instruction
		}
		if cur.Len() == 0 {
			start = i + 1
		}
		if cont, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(cont + " ")
			continue
		}
		cur.WriteString(trimmed)
		keyword, args, _ := strings.Cut(cur.String(), " ")
		out = append(out, instruction{strings.ToUpper(keyword), strings.TrimSpace(args), start})
		cur.Reset()
	}
	return out
}

// kvPairs parses `k=v k2="v 2"` (LABEL, ENV); values may be double-quoted
// with backslash escapes.
func kvPairs(s string) (map[string]string, error) {
	out := map[string]string{}
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		key, rest, ok := strings.Cut(s, "=")
		if !ok || key == "" || strings.ContainsAny(key, " \t\"") {
			return nil, fmt.Errorf("want key=value, got %q", s)
		}
		var value strings.Builder
		if strings.HasPrefix(rest, `"`) {
			i, closed := 1, false
			for ; i < len(rest); i++ {
				c := rest[i]
				if c == '\\' && i+1 < len(rest) {
					i++
					value.WriteByte(rest[i])
					continue
				}
				if c == '"' {
					closed = true
					break
				}
				value.WriteByte(c)
			}
			if !closed {
				return nil, fmt.Errorf("unterminated quote in %q", s)
			}
			rest = rest[i+1:]
		} else {
			v, r, _ := strings.Cut(rest, " ")
			value.WriteString(v)
			rest = r
		}
		if _, dup := out[key]; dup {
			return nil, fmt.Errorf("%s set twice", key)
		}
		out[key] = value.String()
		s = rest
	}
	return out, nil
}

var argRef = regexp.MustCompile(`\$\{(\w+)\}`)

// parseDockerfile reads the parts of the Dockerfile imagebuild restates. An
// instruction in the runtime stage that imagebuild does not restate is an
// error: the Go-built image would silently lack it.
func parseDockerfile(text string) (*dockerfile, error) {
	d := &dockerfile{buildEnv: map[string]string{}, runtimeArg: map[string]string{}, labels: map[string]string{}, copies: map[string]string{}}
	var stages [][]instruction
	for _, in := range splitInstructions(text) {
		switch {
		case in.keyword == "FROM":
			stages = append(stages, []instruction{in})
		case len(stages) == 0 && in.keyword == "ARG":
			name, def, _ := strings.Cut(in.args, "=")
			d.runtimeArg[name] = def
		case len(stages) == 0:
			return nil, fmt.Errorf("line %d: %s before the first FROM", in.line, in.keyword)
		default:
			stages[len(stages)-1] = append(stages[len(stages)-1], in)
		}
	}
	if len(stages) != 2 {
		return nil, fmt.Errorf("%d stages; imagebuild knows a build stage and a runtime stage", len(stages))
	}
	// resolve substitutes ${NAME} with an ARG's default; an ARG without one
	// stays as written, and the comparison with imagebuild shows it.
	resolve := func(s string, args map[string]string) string {
		return argRef.ReplaceAllStringFunc(s, func(m string) string {
			if v, ok := args[argRef.FindStringSubmatch(m)[1]]; ok && v != "" {
				return v
			}
			return m
		})
	}
	buildArgs := map[string]string{}
	build, runtime := stages[0], stages[1]
	if !strings.HasSuffix(build[0].args, " AS build") {
		return nil, fmt.Errorf("line %d: the first stage is not named build", build[0].line)
	}
	for _, in := range build[1:] {
		switch in.keyword {
		case "ARG":
			name, def, _ := strings.Cut(in.args, "=")
			buildArgs[name] = def
		case "ENV":
			env, err := kvPairs(in.args)
			if err != nil {
				return nil, fmt.Errorf("line %d: ENV: %w", in.line, err)
			}
			for k, v := range env {
				d.buildEnv[k] = resolve(v, buildArgs)
			}
		case "RUN":
			d.buildRuns = append(d.buildRuns, in.args)
		}
	}
	d.runtimeRef = resolve(runtime[0].args, d.runtimeArg)
	for _, in := range runtime[1:] {
		switch in.keyword {
		case "LABEL":
			labels, err := kvPairs(in.args)
			if err != nil {
				return nil, fmt.Errorf("line %d: LABEL: %w", in.line, err)
			}
			for k, v := range labels {
				if _, dup := d.labels[k]; dup {
					return nil, fmt.Errorf("line %d: label %s set twice", in.line, k)
				}
				d.labels[k] = v
			}
		case "USER":
			d.user = in.args
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(in.args), &d.entrypoint); err != nil {
				return nil, fmt.Errorf("line %d: ENTRYPOINT %s: want the exec (JSON) form, the image has no shell: %w", in.line, in.args, err)
			}
		case "COPY":
			f := strings.Fields(in.args)
			if len(f) != 3 || f[0] != "--from=build" {
				return nil, fmt.Errorf("line %d: COPY %s: imagebuild knows only `COPY --from=build <binary> <path>`", in.line, in.args)
			}
			d.copies[f[2]] = f[1]
		default:
			return nil, fmt.Errorf("line %d: %s in the runtime stage: imagebuild does not restate it; add it to cachetierSpec and to this parser", in.line, in.keyword)
		}
	}
	return d, nil
}

func TestParseDockerfile(t *testing.T) {
	d, err := parseDockerfile(`# c
ARG RUNTIME_IMAGE=gcr.io/distroless/static-debian12:nonroot
FROM golang AS build
ARG TARGETOS=linux
ENV GOOS=${TARGETOS} \
    # inside
    GOFLAGS="-a -b"
RUN make build BIN=/out
FROM ${RUNTIME_IMAGE}
LABEL a="x \"y\"" \
      b=z
COPY --from=build /out/m /m
USER 1:1
ENTRYPOINT ["/m", "x"]
`)
	if err != nil {
		t.Fatal(err)
	}
	want := &dockerfile{
		buildEnv:   map[string]string{"GOOS": "linux", "GOFLAGS": "-a -b"},
		buildRuns:  []string{"make build BIN=/out"},
		runtimeArg: map[string]string{"RUNTIME_IMAGE": "gcr.io/distroless/static-debian12:nonroot"},
		runtimeRef: "gcr.io/distroless/static-debian12:nonroot",
		labels:     map[string]string{"a": `x "y"`, "b": "z"},
		user:       "1:1",
		entrypoint: []string{"/m", "x"},
		copies:     map[string]string{"/m": "/out/m"},
	}
	if fmt.Sprint(d) != fmt.Sprint(want) {
		t.Errorf("got  %+v\nwant %+v", d, want)
	}
	for name, bad := range map[string]string{
		"shell entrypoint": "FROM a AS build\nFROM b\nENTRYPOINT /m\n",
		"runtime RUN":      "FROM a AS build\nFROM b\nRUN true\n",
		"runtime ENV":      "FROM a AS build\nFROM b\nENV A=b\n",
		"other COPY":       "FROM a AS build\nFROM b\nCOPY x /x\n",
		"label no value":   "FROM a AS build\nFROM b\nLABEL a\n",
		"open quote":       "FROM a AS build\nFROM b\nLABEL a=\"x\n",
		"label twice":      "FROM a AS build\nFROM b\nLABEL a=1\nLABEL a=2\n",
		"three stages":     "FROM a AS build\nFROM b\nFROM c\n",
		"unnamed build":    "FROM a\nFROM b\n",
		"before FROM":      "LABEL a=1\nFROM a AS build\nFROM b\n",
	} {
		if _, err := parseDockerfile(bad); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// FuzzParseDockerfile: any text gives a parse or an error, never a panic.
func FuzzParseDockerfile(f *testing.F) {
	f.Add("FROM a AS build\nENV A=\"b\\\"\" C=d\nFROM b\nLABEL x=\"y\" \\\n z=w\nENTRYPOINT [\"/m\"]\n")
	f.Fuzz(func(t *testing.T, text string) {
		d, err := parseDockerfile(text)
		if err == nil && d == nil {
			t.Fatal("nil result without an error")
		}
	})
}

// diffMaps lists the keys whose values differ, each side's value shown.
func diffMaps(a, b map[string]string, aName, bName string) []string {
	var out []string
	keys := slices.Sorted(maps.Keys(a))
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	for _, k := range keys {
		av, aok := a[k]
		bv, bok := b[k]
		switch {
		case !aok:
			out = append(out, fmt.Sprintf("%s only in %s (%q)", k, bName, bv))
		case !bok:
			out = append(out, fmt.Sprintf("%s only in %s (%q)", k, aName, av))
		case av != bv:
			out = append(out, fmt.Sprintf("%s: %s %q, %s %q", k, aName, av, bName, bv))
		}
	}
	return out
}
