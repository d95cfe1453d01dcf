//! placeholder: the binary arrives with its issue.
fn main() {}
