//! The README shows the quickstarts as they are in `examples/`, where they are compiled
//! (`cargo test --all-features` builds every example): a quickstart copied from the README
//! builds.

#[test]
fn every_quickstart_in_the_readme_is_its_example_file() {
    let readme =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let mut shown = 0;
    let mut rest = readme.as_str();
    while let Some(at) = rest.find("<!-- examples/") {
        rest = &rest[at + "<!-- ".len()..];
        let (path, after) = rest
            .split_once(" -->\n")
            .expect("a marker ends with ` -->`");
        let block = after
            .strip_prefix("```rust,ignore\n")
            .or_else(|| after.strip_prefix("```rust,no_run\n"))
            .unwrap_or_else(|| panic!("{path}: the marker is not followed by a rust block"));
        let code = &block[..block.find("```\n").expect("the block ends")];
        let file = std::fs::read_to_string(format!("{}/{path}", env!("CARGO_MANIFEST_DIR")))
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        // The file's own doc comment (which names it) is not shown.
        let file_code: String = file
            .lines()
            .skip_while(|line| line.starts_with("//!") || line.is_empty())
            .flat_map(|line| [line, "\n"])
            .collect();
        assert_eq!(code, file_code, "the README's block differs from {path}");
        shown += 1;
    }
    assert_eq!(shown, 4, "the README shows four quickstarts");
}
