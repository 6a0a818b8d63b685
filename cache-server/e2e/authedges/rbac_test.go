package authedges

import (
	"context"
	"fmt"
	"testing"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apiserver/pkg/authentication/serviceaccount"
)

// bindReader lets subject (a user name) read dataNamespace's configmaps
// and waits until the apiserver's authorizer says so. It returns the
// RoleBinding's name.
func bindReader(t *testing.T, user string) string {
	t.Helper()
	return bind(t, rbacv1.Subject{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user})
}

func bind(t *testing.T, subject rbacv1.Subject) string {
	t.Helper()
	ctx := context.Background()
	name := configmapReader + "-" + subject.Kind + "-" + subject.Name
	if _, err := kc.RbacV1().RoleBindings(dataNamespace).Create(ctx, &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: configmapReader},
		Subjects:   []rbacv1.Subject{subject},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitAllowed(t, subject, true)
	return name
}

// waitAllowed waits until the apiserver's authorizer says allowed for
// subject listing dataNamespace's configmaps (RBAC reads bindings from an
// informer: a change takes effect a moment after the write).
func waitAllowed(t *testing.T, subject rbacv1.Subject, allowed bool) {
	t.Helper()
	// The subject as the authorizer sees a request of it.
	user, groups := subject.Name, []string(nil)
	switch subject.Kind {
	case rbacv1.ServiceAccountKind:
		user = serviceaccount.MakeUsername(subject.Namespace, subject.Name)
	case rbacv1.GroupKind:
		user, groups = "a-member", []string{subject.Name}
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		sar, err := kc.AuthorizationV1().SubjectAccessReviews().Create(context.Background(), &authorizationv1.SubjectAccessReview{
			Spec: authorizationv1.SubjectAccessReviewSpec{User: user, Groups: groups, ResourceAttributes: &authorizationv1.ResourceAttributes{
				Namespace: dataNamespace, Verb: "list", Resource: "configmaps",
			}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed == allowed {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("RBAC did not say allowed=%v for %s %s within 30s", allowed, subject.Kind, subject.Name)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestRBACRevoked: users reading through the tier lose their RoleBinding
// mid-run. The apiserver refuses them as soon as its RBAC informer sees
// the deletion; the tier keeps SubjectAccessReview answers for
// authCacheTTL, so it must refuse within that TTL (plus a margin), with
// the apiserver's 403. Each reader is its own user (one RoleBinding for
// their group), so no reader's cached answer serves another.
func TestRBACRevoked(t *testing.T) {
	ctx := context.Background()
	group := "revokees"
	binding := bind(t, rbacv1.Subject{Kind: rbacv1.GroupKind, APIGroup: rbacv1.GroupName, Name: group})
	var readers []reader
	for i, tg := range append([]target{apiserver}, targets...) {
		readers = append(readers, reader{tg: tg, cred: credential{cert: clientCert(t, fmt.Sprintf("revokee-%d", i), group)}})
	}
	path := "/api/v1/namespaces/" + dataNamespace + "/configmaps"
	got := untilRefused(t, readers, path, func() {
		if err := kc.RbacV1().RoleBindings(dataNamespace).Delete(ctx, binding, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	refusedInTime(t, readers, got, path)
}
