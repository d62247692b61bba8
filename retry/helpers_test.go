package retry_test

import "github.com/outboundhq/outbound/classify"

// classifyCategory maps a fuzzed byte onto the categories (and one invalid
// value).
func classifyCategory(b uint8) classify.Category { return classify.Category(b % 5) }
