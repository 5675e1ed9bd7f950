package routetable

import (
	"reflect"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/mci-dev/mci/pkg/apis/inference/v1alpha1"
)

// An entry that differs from another in any one field is not the same
// entry: sameEntry compares every field of ImportedCluster, including
// fields added after it was written (the test fills the entry by
// reflection, every leaf set, then changes one leaf at a time).
func TestSameEntryComparesEveryField(t *testing.T) {
	entry := func(change int) *v1alpha1.ImportedCluster {
		var ic v1alpha1.ImportedCluster
		leaf := 0
		fillEntry(reflect.ValueOf(&ic).Elem(), change, &leaf)
		return &ic
	}
	leaves := 0
	fillEntry(reflect.ValueOf(&v1alpha1.ImportedCluster{}).Elem(), -1, &leaves)
	base := entry(-1)
	if !sameEntry(base, entry(-1)) {
		t.Fatal("two entries filled alike are not the same entry")
	}
	for i := range leaves {
		if sameEntry(base, entry(i)) {
			t.Errorf("leaf %d of the entry changed, and sameEntry does not see it", i)
		}
	}
	empty := &v1alpha1.ImportedCluster{}
	if sameEntry(empty, base) || !sameEntry(empty, &v1alpha1.ImportedCluster{}) {
		t.Error("an empty entry is the same as a filled one, or not as another empty one")
	}
	t.Logf("%d leaves", leaves)
}

// fillEntry sets every leaf of v (strings, integers, times; one element
// of each list and map, every pointer set) to a value, and leaf number
// change, counted by leaf, to another.
func fillEntry(v reflect.Value, change int, leaf *int) {
	value := func() int {
		*leaf++
		if *leaf-1 == change {
			return 2
		}
		return 1
	}
	switch v.Kind() {
	case reflect.String:
		v.SetString(string(rune('a' + value())))
	case reflect.Int32, reflect.Int64:
		v.SetInt(int64(value()))
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fillEntry(v.Elem(), change, leaf)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 1, 1))
		fillEntry(v.Index(0), change, leaf)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		val := reflect.New(v.Type().Elem()).Elem()
		fillEntry(val, change, leaf)
		m.SetMapIndex(reflect.ValueOf("key"), val)
		v.Set(m)
	case reflect.Struct:
		if v.Type() == reflect.TypeFor[metav1.Time]() {
			v.Set(reflect.ValueOf(metav1.NewTime(time.Unix(int64(value()), 0).UTC())))
			return
		}
		for i := range v.NumField() {
			fillEntry(v.Field(i), change, leaf)
		}
	default:
		panic("fillEntry: a field of kind " + v.Kind().String() + " is new to the test: teach it, and sameEntry, that kind")
	}
}
