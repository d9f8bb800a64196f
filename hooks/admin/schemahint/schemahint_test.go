package schemahint

import (
	"errors"
	"strings"
	"testing"
)

const umbrella = `{"properties": {"dcgm": {"properties": {"image": {"properties": {"tag": {}, "repository": {}}}, "enabled": {}}},
	"driver": {"properties": {"upgradePolicy": {"properties": {"maxUnavailable": {}}}}}}}`

const subchart = `{"properties": {"image": {}, "resources": {}}}`

func TestUnknownKeysGetTheClosestKnownKey(t *testing.T) {
	helm := errors.New("values don't meet the specifications of the schema(s) in the following chart(s):\n" +
		"kube-gpu-stack:\n" +
		"- at '/dcgm': additional properties 'imagee' not allowed\n" +
		"- at '/driver/upgradePolicy': additional properties 'maxUnavailble', 'completelyElse' not allowed\n" +
		"dcgm:\n" +
		"- at '': additional properties 'resorces' not allowed\n")
	got := Explain(helm, map[string][]byte{"kube-gpu-stack": []byte(umbrella), "dcgm": []byte(subchart)})
	for _, want := range []string{
		`- at '/dcgm': additional properties 'imagee' not allowed ("imagee": did you mean "image"?)`,
		`'maxUnavailble', 'completelyElse' not allowed ("maxUnavailble": did you mean "maxUnavailable"?)`,
		`- at '': additional properties 'resorces' not allowed ("resorces": did you mean "resources"?)`,
	} {
		if !strings.Contains(got.Error(), want) {
			t.Errorf("hinted error lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got.Error(), `"completelyElse": did you mean`) {
		t.Errorf("a key close to nothing got a suggestion:\n%s", got)
	}
	if !errors.Is(got, helm) {
		t.Error("the hinted error does not wrap Helm's")
	}
	other := errors.New("template: x: error calling fail: driver.os: bad")
	if Explain(other, nil) != other {
		t.Error("an error without unknown keys changed")
	}
}
