package main

import (
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"sort"
	"strings"

	operatorsv1alpha1 "github.com/operator-framework/api/pkg/operators/v1alpha1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// Bundle layout constants; annotations.yaml and bundle.Dockerfile must agree.
const (
	packageName    = "cachetier"
	channel        = "alpha"
	manifestsDir   = "bundle/manifests"
	metadataDir    = "bundle/metadata"
	dockerfileName = "bundle.Dockerfile"
	managerEnvRel  = "RELATED_IMAGE_CACHE_SERVER"
)

// Generate renders the bundle from config/manifests under root. It is a pure
// function of the files it reads: no timestamps, sorted output, so that the
// committed bundle can be compared byte for byte with a fresh generation.
// The result maps paths relative to root to file contents.
func Generate(root string) (map[string][]byte, error) {
	objs, err := build(root)
	if err != nil {
		return nil, err
	}
	var (
		csv        *operatorsv1alpha1.ClusterServiceVersion
		deployment *appsv1.Deployment
		samples    []map[string]any
		roles      = map[string]*unstructured.Unstructured{} // kind/namespace/name
		bindings   []*unstructured.Unstructured
		others     []*unstructured.Unstructured
		namespace  string
		saName     string
	)
	for _, o := range objs {
		switch o.GetKind() {
		case "ClusterServiceVersion":
			csv = &operatorsv1alpha1.ClusterServiceVersion{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, csv); err != nil {
				return nil, fmt.Errorf("CSV base: %w", err)
			}
		case "Deployment":
			if deployment != nil {
				return nil, fmt.Errorf("more than one Deployment in config/manifests")
			}
			deployment = &appsv1.Deployment{}
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, deployment); err != nil {
				return nil, err
			}
		case "Namespace":
			namespace = o.GetName() // OLM creates the install namespace
		case "ServiceAccount":
			saName = o.GetName() // OLM creates it from the permissions
		case "CacheProfile":
			samples = append(samples, o.Object)
		case "ClusterRole", "Role":
			roles[o.GetKind()+"/"+o.GetNamespace()+"/"+o.GetName()] = o
		case "ClusterRoleBinding", "RoleBinding":
			bindings = append(bindings, o)
		case "CustomResourceDefinition", "Service", "PodDisruptionBudget":
			// OLM installs a bundle's PodDisruptionBudget as it is (the
			// manager's: a drain moves one replica at a time).
			others = append(others, o)
		default:
			return nil, fmt.Errorf("%s %s: kind not handled by the bundle generator", o.GetKind(), o.GetName())
		}
	}
	if csv == nil || deployment == nil || saName == "" || namespace == "" {
		return nil, fmt.Errorf("config/manifests must contain the CSV base, the manager Deployment, its ServiceAccount and Namespace")
	}

	// Roles bound to the manager's ServiceAccount become the CSV's
	// permissions (Roles of the install namespace) and clusterPermissions
	// (ClusterRoles). OLM can only grant namespaced permissions in the
	// install namespace, so a Role elsewhere (kube-system) is granted
	// cluster-wide through clusterPermissions: a documented widening.
	var perms, clusterPerms []rbacv1.PolicyRule
	usedRoles := map[string]bool{}
	for _, b := range bindings {
		var subjects []rbacv1.Subject
		if err := convert(b.Object["subjects"], &subjects); err != nil {
			return nil, err
		}
		if !slices.ContainsFunc(subjects, func(s rbacv1.Subject) bool { return s.Kind == "ServiceAccount" && s.Name == saName }) {
			return nil, fmt.Errorf("%s %s binds something else than the manager", b.GetKind(), b.GetName())
		}
		var ref rbacv1.RoleRef
		if err := convert(b.Object["roleRef"], &ref); err != nil {
			return nil, err
		}
		ns := ""
		if ref.Kind == "Role" {
			ns = b.GetNamespace()
		}
		k := ref.Kind + "/" + ns + "/" + ref.Name
		role, ok := roles[k]
		if !ok {
			return nil, fmt.Errorf("%s %s refers to missing %s", b.GetKind(), b.GetName(), k)
		}
		usedRoles[k] = true
		var rules []rbacv1.PolicyRule
		if err := convert(role.Object["rules"], &rules); err != nil {
			return nil, err
		}
		if ref.Kind == "Role" && ns == namespace {
			perms = append(perms, rules...)
		} else {
			clusterPerms = append(clusterPerms, rules...)
		}
	}
	roleKeys := make([]string, 0, len(roles))
	for k := range roles {
		roleKeys = append(roleKeys, k)
	}
	sort.Strings(roleKeys)
	for _, k := range roleKeys {
		if !usedRoles[k] {
			if roles[k].GetKind() == "Role" {
				return nil, fmt.Errorf("Role %s is not bound to the manager; OLM bundles cannot ship it", k)
			}
			others = append(others, roles[k]) // user-facing ClusterRoles ship as manifests
		}
	}

	// Under kustomize the manager runs its own image for the fleets (it
	// reads it from its pod). OLM bundles name every image they run in
	// relatedImages and the RELATED_IMAGE_* variables, which mirroring
	// tools rewrite, so the bundle states the cache-server image
	// explicitly: the manager's own, unless the Deployment already sets
	// another.
	managerImage, cacheServerImage := "", ""
	for i, c := range deployment.Spec.Template.Spec.Containers {
		if c.Name != "manager" {
			continue
		}
		managerImage = c.Image
		for _, e := range c.Env {
			if e.Name == managerEnvRel {
				cacheServerImage = e.Value
			}
		}
		if cacheServerImage == "" {
			cacheServerImage = managerImage
			deployment.Spec.Template.Spec.Containers[i].Env = append(deployment.Spec.Template.Spec.Containers[i].Env,
				corev1.EnvVar{Name: managerEnvRel, Value: cacheServerImage})
		}
	}
	version := managerImage[strings.LastIndex(managerImage, ":")+1:]
	if managerImage == "" || version == managerImage {
		return nil, fmt.Errorf("manager container needs a tagged image")
	}

	almExamples, err := json.MarshalIndent(samples, "", "  ")
	if err != nil {
		return nil, err
	}
	csv.Name = packageName + ".v" + version
	csv.Namespace = ""
	csv.Spec.Version.Version, err = parseVersion(version)
	if err != nil {
		return nil, err
	}
	if csv.Annotations == nil {
		csv.Annotations = map[string]string{}
	}
	csv.Annotations["alm-examples"] = string(almExamples)
	csv.Annotations["containerImage"] = managerImage
	csv.Annotations["operators.operatorframework.io/suggested-namespace"] = namespace
	csv.Spec.RelatedImages = []operatorsv1alpha1.RelatedImage{{Name: "cache-server", Image: cacheServerImage}, {Name: "manager", Image: managerImage}}
	csv.Spec.InstallStrategy = operatorsv1alpha1.NamedInstallStrategy{
		StrategyName: operatorsv1alpha1.InstallStrategyNameDeployment,
		StrategySpec: operatorsv1alpha1.StrategyDetailsDeployment{
			DeploymentSpecs: []operatorsv1alpha1.StrategyDeploymentSpec{{Name: deployment.Name, Label: deployment.Labels, Spec: deployment.Spec}},
			Permissions:     []operatorsv1alpha1.StrategyDeploymentPermissions{{ServiceAccountName: saName, Rules: perms}},
			ClusterPermissions: []operatorsv1alpha1.StrategyDeploymentPermissions{
				{ServiceAccountName: saName, Rules: clusterPerms},
			},
		},
	}

	out := map[string][]byte{}
	csvYAML, err := toYAML(csv)
	if err != nil {
		return nil, err
	}
	out[path.Join(manifestsDir, packageName+".clusterserviceversion.yaml")] = csvYAML
	for _, o := range others {
		o = o.DeepCopy()
		o.SetNamespace("") // OLM places namespaced manifests in the install namespace
		b, err := toYAML(o.Object)
		if err != nil {
			return nil, err
		}
		out[path.Join(manifestsDir, manifestFileName(o))] = b
	}
	out[path.Join(metadataDir, "annotations.yaml")] = []byte(annotationsYAML())
	out[dockerfileName] = []byte(dockerfile())
	return out, nil
}

// build runs kustomize on config/manifests in process (no kubectl needed).
func build(root string) ([]*unstructured.Unstructured, error) {
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	rm, err := k.Run(filesys.MakeFsOnDisk(), path.Join(root, "config", "manifests"))
	if err != nil {
		return nil, fmt.Errorf("kustomize config/manifests: %w", err)
	}
	var out []*unstructured.Unstructured
	for _, r := range rm.Resources() {
		// Through JSON so numbers are int64/float64 as in any decoded object.
		b, err := r.MarshalJSON()
		if err != nil {
			return nil, err
		}
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON(b); err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

func convert(in any, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, out)
}

// toYAML marshals through an unstructured map with empty values pruned, so
// typed zero values (creationTimestamp: null, status: {}) do not appear.
func toYAML(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	delete(m, "status")
	prune(m)
	return yaml.Marshal(m)
}

func prune(m map[string]any) {
	for k, v := range m {
		switch t := v.(type) {
		case nil:
			delete(m, k)
		case map[string]any:
			prune(t)
			if len(t) == 0 {
				delete(m, k)
			}
		case []any:
			for _, e := range t {
				if em, ok := e.(map[string]any); ok {
					prune(em)
				}
			}
		}
	}
}

// manifestFileName follows operator-sdk's naming so bundles look familiar.
func manifestFileName(o *unstructured.Unstructured) string {
	if o.GetKind() == "CustomResourceDefinition" {
		return o.GetName()[strings.Index(o.GetName(), ".")+1:] + "_" + strings.SplitN(o.GetName(), ".", 2)[0] + ".yaml"
	}
	gv := strings.ReplaceAll(o.GetAPIVersion(), "/", "_")
	return strings.ToLower(fmt.Sprintf("%s_%s_%s.yaml", o.GetName(), gv, o.GetKind()))
}

func annotationsYAML() string {
	var b strings.Builder
	b.WriteString("annotations:\n")
	for _, kv := range bundleLabels() {
		fmt.Fprintf(&b, "  %s: %s\n", kv[0], kv[1])
	}
	return b.String()
}

func dockerfile() string {
	var b strings.Builder
	b.WriteString("# Generated by hack/bundlegen (make bundle); do not edit.\nFROM scratch\n\n")
	for _, kv := range bundleLabels() {
		fmt.Fprintf(&b, "LABEL %s=%s\n", kv[0], kv[1])
	}
	b.WriteString("\nCOPY bundle/manifests /manifests/\nCOPY bundle/metadata /metadata/\n")
	return b.String()
}

func bundleLabels() [][2]string {
	return [][2]string{
		{"operators.operatorframework.io.bundle.mediatype.v1", "registry+v1"},
		{"operators.operatorframework.io.bundle.manifests.v1", "manifests/"},
		{"operators.operatorframework.io.bundle.metadata.v1", "metadata/"},
		{"operators.operatorframework.io.bundle.package.v1", packageName},
		{"operators.operatorframework.io.bundle.channels.v1", channel},
		{"operators.operatorframework.io.bundle.channel.default.v1", channel},
	}
}
