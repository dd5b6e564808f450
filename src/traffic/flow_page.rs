//! The flow-log web page (issue 22): `GET /flows/ui` on the health server when flow logs are
//! on (the route is not added otherwise, so the path answers 404 with flow logs off).
//!
//! What it owns: one self-contained HTML page (`flow_page.html`, compiled into the binary) that
//! polls `GET /flows` beside it ([`super::flow_log::route`]) every 2 s and shows a table of the
//! records with filters by namespace, pod, action and policy, denied flows marked, and the hit
//! counts per policy; with staged policies (issue 23), a column of each record's pending
//! verdict and a "would change only" toggle for the records whose pending action differs from
//! the enforced one. Filtering happens in the page over the records it fetched, so the page
//! needs nothing of the API beyond the unfiltered list.
//!
//! What it guarantees: the page loads nothing from outside the agent (its
//! Content-Security-Policy forbids every other source, so a later edit that adds one fails in
//! the browser test rather than silently reaching the network), and every value of a record
//! (names come from Kubernetes objects, addresses from packets) is written into the page as
//! text, never as markup. tests/flow_page_browser.rs checks both in a real browser; the unit
//! tests below keep the HTML free of the DOM calls that parse markup.

use crate::telemetry::http::Reply;

/// Where the page is served.
pub const PATH: &str = "/flows/ui";

/// The page, as shipped.
pub const PAGE: &str = include_str!("flow_page.html");

/// `GET /flows/ui` (and `/flows/ui/`): the page; `None` for any other path.
pub fn route(path: &str) -> Option<Reply> {
    (path == PATH || path.strip_suffix('/') == Some(PATH)).then(|| Reply {
        status: 200,
        content_type: "text/html; charset=utf-8",
        body: PAGE.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_at_its_path_only() {
        let reply = route("/flows/ui").expect("the page");
        assert_eq!(reply.status, 200);
        assert!(reply.content_type.starts_with("text/html"));
        assert!(reply.body.contains("<table id=\"flows\">"));
        assert!(route("/flows/ui/").is_some());
        assert!(route("/flows").is_none(), "the API stays flow_log's");
        assert!(route("/flows/uix").is_none());
        assert!(route("/").is_none());
    }

    #[test]
    fn page_is_self_contained_and_writes_values_as_text() {
        // Nothing loaded from elsewhere: no remote URL in any attribute or script.
        for needle in ["http://", "https://", "//cdn", "src=\"", "@import", "url("] {
            assert!(!PAGE.contains(needle), "the page references {needle:?}");
        }
        assert!(
            PAGE.contains("default-src 'none'") && PAGE.contains("connect-src 'self'"),
            "the Content-Security-Policy keeps the page to itself"
        );
        // Markup parsers: a record's value given to any of these could become HTML.
        for sink in [
            "innerHTML",
            "outerHTML",
            "insertAdjacentHTML",
            "document.write",
            "DOMParser",
            "createContextualFragment",
            "eval(",
            "new Function",
        ] {
            assert!(!PAGE.contains(sink), "the page uses {sink}");
        }
    }
}
