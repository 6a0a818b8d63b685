package main

import "testing"

func TestFloodServerList(t *testing.T) {
	keys, err := floodServerList("apiserver, fleet-aggregated")
	if err != nil || len(keys) != 2 || keys[0] != "apiserver" || keys[1] != "fleet-aggregated" {
		t.Fatalf("got %v, %v", keys, err)
	}
	if _, err := floodServerList("apiserver,aggregator"); err == nil {
		t.Fatal("an unknown server was accepted")
	}
}
