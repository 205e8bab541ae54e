// A stand-in for spice-1.0.jar in tests: same command line and output format, toy scores.
//
// Reads SPICE's input (a JSON list of {"image_id", "test", "refs"}), accepts SPICE 1.0's options
// (-out, -cache, -threads, -subset, -silent, ...) and writes SPICE's -out format: a list of
// {"image_id", "scores": {"All": {"pr", "re", "f", "tp", "fp", "fn", "numImages"}, ...}}.
// The score is a token-overlap F1 of the lowercased, whitespace-split test caption against
// the union of the refs' tokens; null (as SPICE's pretty-printer writes NaN) when the test
// has no token. Entries are written in reverse order. FAKE_SPICE_MODE=fail exits with status
// 3, =garbage writes non-JSON, =missing drops the last entry.
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;

public class FakeSpice {
    private final String s;
    private int i;

    private FakeSpice(String s) {
        this.s = s;
    }

    private void ws() {
        while (i < s.length() && Character.isWhitespace(s.charAt(i))) i++;
    }

    private Object value() {
        ws();
        char c = s.charAt(i);
        if (c == '[') {
            List<Object> list = new ArrayList<>();
            i++;
            ws();
            if (s.charAt(i) == ']') { i++; return list; }
            while (true) {
                list.add(value());
                ws();
                if (s.charAt(i++) == ']') return list;
            }
        }
        if (c == '{') {
            Map<String, Object> map = new LinkedHashMap<>();
            i++;
            ws();
            if (s.charAt(i) == '}') { i++; return map; }
            while (true) {
                ws();
                String key = (String) value();
                ws();
                i++; // ':'
                map.put(key, value());
                ws();
                if (s.charAt(i++) == '}') return map;
            }
        }
        if (c == '"') {
            StringBuilder b = new StringBuilder();
            i++;
            while (s.charAt(i) != '"') {
                char d = s.charAt(i++);
                if (d == '\\') {
                    char e = s.charAt(i++);
                    if (e == 'u') { b.append((char) Integer.parseInt(s.substring(i, i + 4), 16)); i += 4; }
                    else if (e == 'n') b.append('\n');
                    else if (e == 't') b.append('\t');
                    else if (e == 'r') b.append('\r');
                    else if (e == 'b') b.append('\b');
                    else if (e == 'f') b.append('\f');
                    else b.append(e);
                } else b.append(d);
            }
            i++;
            return b.toString();
        }
        int start = i;
        while (i < s.length() && "{}[],: \n\t\r".indexOf(s.charAt(i)) < 0) i++;
        String word = s.substring(start, i);
        if (word.equals("null") || word.equals("true") || word.equals("false")) return word;
        return Long.parseLong(word);
    }

    private static Set<String> tokens(String caption) {
        Set<String> out = new HashSet<>();
        for (String t : caption.toLowerCase(Locale.ROOT).trim().split("\\s+")) if (!t.isEmpty()) out.add(t);
        return out;
    }

    private static String num(double x) {
        return Double.isNaN(x) ? "null" : Double.toString(x);
    }

    @SuppressWarnings("unchecked")
    public static void main(String[] args) throws IOException {
        String out = null;
        for (int a = 1; a < args.length; a++) {
            String arg = args[a];
            if (arg.equals("-out")) out = args[++a];
            else if (arg.equals("-cache") || arg.equals("-threads")) a++;
            else if (!(arg.equals("-subset") || arg.equals("-silent") || arg.equals("-detailed") || arg.equals("-noSynsets"))) {
                System.err.println("Unknown option \"" + arg + "\"");
                System.exit(1);
            }
        }
        String mode = System.getenv().getOrDefault("FAKE_SPICE_MODE", "");
        if (mode.equals("fail")) {
            System.err.println("Parsing reference captions");
            System.err.println("Error: Could not score batched file input: fake failure");
            System.exit(3);
        }
        String text = new String(Files.readAllBytes(Paths.get(args[0])), StandardCharsets.UTF_8);
        List<Object> items = (List<Object>) new FakeSpice(text).value();
        StringBuilder json = new StringBuilder("[\n");
        int last = mode.equals("missing") ? 1 : 0;
        for (int k = items.size() - 1; k >= last; k--) {
            Map<String, Object> item = (Map<String, Object>) items.get(k);
            Set<String> test = tokens((String) item.get("test"));
            Set<String> refs = new HashSet<>();
            for (Object r : (List<Object>) item.get("refs")) refs.addAll(tokens((String) r));
            int tp = 0;
            for (String t : test) if (refs.contains(t)) tp++;
            double pr = test.isEmpty() ? Double.NaN : tp / (double) test.size();
            double re = refs.isEmpty() ? Double.NaN : tp / (double) refs.size();
            double f = Double.isNaN(pr) || Double.isNaN(re) ? Double.NaN : (tp == 0 ? 0.0 : 2 * pr * re / (pr + re));
            json.append("  {\n    \"image_id\": ").append(item.get("image_id")).append(",\n    \"scores\": {\n");
            json.append("      \"All\": {\"pr\": ").append(num(pr)).append(", \"re\": ").append(num(re))
                .append(", \"f\": ").append(num(f)).append(", \"tp\": ").append(tp)
                .append(", \"fp\": ").append(test.size() - tp).append(", \"fn\": ").append(refs.size() - tp)
                .append(", \"numImages\": 1},\n");
            json.append("      \"Size\": {\"pr\": null, \"re\": null, \"f\": null, \"numImages\": 0}\n    }\n  }");
            json.append(k > last ? ",\n" : "\n");
        }
        json.append("]\n");
        String written = mode.equals("garbage") ? "SPICE evaluation took: 1 s (not JSON)" : json.toString();
        Files.write(Paths.get(out), written.getBytes(StandardCharsets.UTF_8));
    }
}
