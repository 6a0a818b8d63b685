package front

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
)

func schemaGR() schema.GroupResource { return schema.GroupResource{} }
