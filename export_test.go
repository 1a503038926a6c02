package goharvest

import (
	"github.com/goharvest/goharvest/internal/epoch"
)

// EncodeNote and MaxNotedRecords let tests write a note as the harvester does (see note.go).
var EncodeNote = epoch.EncodeNote

type Noted = epoch.Noted

const MaxNotedRecords = epoch.MaxNotedRecords
