package classify

// NothingWritten exports nothingWritten to the package's external tests.
var NothingWritten = nothingWritten
